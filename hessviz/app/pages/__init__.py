"""The app's pages: each a Streamlit script that ``st.navigation`` runs (:data:`hessviz.app.registry.PAGES`),
never imported."""
