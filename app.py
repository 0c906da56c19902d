"""hessviz app in a source checkout: ``streamlit run app.py`` (from an install: ``hessviz app``)."""

from hessviz.app.main import main

if __name__ == "__main__":  # Streamlit runs a script as __main__; an import draws nothing
    main()
