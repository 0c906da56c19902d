"""hessviz app: ``streamlit run app.py``. Routes over the scripts in ``pages/``."""

import os

import streamlit as st
import torch

from hessviz.app.registry import SECTIONS

# One intra-op thread by default: on small shared machines (2 vCPUs, Streamlit and the browser
# on the same cores) torch's spinning worker threads made a 0.2 s computation take tens of seconds.
# HESSVIZ_APP_THREADS=0 keeps torch's default; any other number sets it.
_threads = int(os.environ.get("HESSVIZ_APP_THREADS", "1"))
if _threads > 0 and torch.get_num_threads() != _threads:
    torch.set_num_threads(_threads)

st.set_page_config(page_title="hessviz: the Hessian of a Transformer block", page_icon=":material/grid_on:",
                   layout="wide", initial_sidebar_state="expanded")

nav = st.navigation({section: [st.Page(p.script, title=p.title, icon=p.icon, url_path=p.url_path,
                                       default=p.default) for p in pages]
                     for section, pages in SECTIONS.items()})
nav.run()
