"""hessviz app: ``streamlit run app.py``. Routes over the scripts in ``pages/``.

The server's limits come from one setting, ``HESSVIZ_PROFILE`` (``local`` or ``hosted``),
read from the environment or from a root-level key of ``.streamlit/secrets.toml``
(Streamlit copies those into the environment); see :mod:`hessviz.app.profiles`.
"""

import os

import streamlit as st

st.secrets.load_if_toml_exists()  # root-level secrets (HESSVIZ_PROFILE = "hosted") become env vars

import torch  # noqa: E402

# One intra-op thread by default: on small shared machines (2 vCPUs, Streamlit and the browser
# on the same cores) torch's spinning worker threads made a 0.2 s computation take tens of seconds,
# and concurrent visitors are spread over the cores by the budget's gate instead.
# HESSVIZ_APP_THREADS=0 keeps torch's default; any other number sets it.
_threads = int(os.environ.get("HESSVIZ_APP_THREADS", "1"))
if _threads > 0 and torch.get_num_threads() != _threads:
    torch.set_num_threads(_threads)

# Importing hessviz.app loads every module the pages need (pandas, plotly, scipy, …) under
# Python's import lock, before any page runs: concurrent first imports from several
# sessions' script threads raised "partially initialized module 'pandas'".
from hessviz import app as hva  # noqa: E402
from hessviz.app import styles, warm  # noqa: E402
from hessviz.app.registry import SECTIONS  # noqa: E402
from hessviz.app.runlog import timed  # noqa: E402
from hessviz.plots import drawn_in  # noqa: E402

lesson = hva.begin_run()  # the address the browser asked for, and its lesson flags
st.set_page_config(
    page_title="hessviz: the Hessian of a Transformer block",
    page_icon=":material/grid_on:",
    layout="wide",
    initial_sidebar_state="collapsed" if lesson.present else "auto",
)
styles.apply(lesson)

nav = st.navigation(
    {
        section: [
            st.Page(p.script, title=p.title, icon=p.icon, url_path=p.url_path, default=p.default)
            for p in pages
        ]
        for section, pages in SECTIONS.items()
    },
    position="hidden",
)  # hva.open_page draws the links, each carrying the view
hva.open_page(nav.url_path or "hessian_map")
# Figures are laid out in Streamlit's theme from the start (hva.chart shows them in it; a light
# template first, replaced there, cost 20-50 ms of CPU per figure). HESSVIZ_RUN_LOG=1: one line
# per run (hessviz.app.runlog).
# warm.serving: while any run is in progress, the background warmer (hessviz.app.warm) waits.
with timed(nav.url_path or "hessian_map"), drawn_in("host"), warm.serving():
    nav.run()
