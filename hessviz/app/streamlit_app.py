"""The app as the package serves it: ``hessviz app`` runs this script (:mod:`hessviz.app.serve`)."""

from hessviz.app.main import main

if __name__ == "__main__":  # Streamlit runs a script as __main__; an import (a doctest run) draws nothing
    main()
