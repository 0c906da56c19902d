from hessviz.cli import main

raise SystemExit(main())
