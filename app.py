"""hessviz app: ``streamlit run app.py``. Routes over the scripts in ``pages/``."""

import streamlit as st

from hessviz.app.registry import SECTIONS

st.set_page_config(page_title="hessviz: the Hessian of a Transformer block", page_icon=":material/grid_on:",
                   layout="wide", initial_sidebar_state="expanded")

nav = st.navigation({section: [st.Page(p.script, title=p.title, icon=p.icon, url_path=p.url_path,
                                       default=p.default) for p in pages]
                     for section, pages in SECTIONS.items()})
nav.run()
