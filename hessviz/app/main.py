"""The app's one script run: read the address, set up the page, draw the navigation, run the page.

Streamlit runs a script file on every interaction; both scripts are two lines that call :func:`main`:
the checkout's ``app.py`` (``streamlit run app.py``) and the package's
``hessviz/app/streamlit_app.py`` (``hessviz app``, :mod:`hessviz.app.serve`). The pages are scripts
too, in ``hessviz/app/pages/`` (:data:`hessviz.app.registry.PAGES`), so an install serves the same
app as a checkout.

The server's limits come from one setting, ``HESSVIZ_PROFILE`` (``local`` or ``hosted``), read from
the environment or from a root-level key of ``.streamlit/secrets.toml`` (Streamlit copies those into
the environment); see :mod:`hessviz.app.profiles`.
"""

from __future__ import annotations

import os

import streamlit as st


def _threads() -> None:
    """One intra-op torch thread by default.

    On small shared machines (2 vCPUs, Streamlit and the browser on the same cores) torch's spinning
    worker threads made a 0.2 s computation take tens of seconds, and concurrent visitors are spread
    over the cores by the budget's gate instead. ``HESSVIZ_APP_THREADS=0`` keeps torch's default; any
    other number sets it."""
    import torch

    threads = int(os.environ.get("HESSVIZ_APP_THREADS", "1"))
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def main() -> None:
    """One run of the app (Streamlit calls the script, the script calls this)."""
    from hessviz.app import running

    running.show()  # first: a cold server's first run imports for seconds before it draws anything
    st.secrets.load_if_toml_exists()  # root-level secrets (HESSVIZ_PROFILE = "hosted") become env vars
    _threads()
    from hessviz import app as hva

    hva.preload()  # every module the pages need, once, under a lock, before any page runs
    if hva.cache.LIMITS.profile == "hosted" and st.get_option("client.showErrorDetails") != "none":
        st.set_option("client.showErrorDetails", "none")  # a visitor never sees a trace with server paths
    from hessviz.app import admission, cache, styles, warm
    from hessviz.app.registry import SECTIONS
    from hessviz.app.runlog import timed
    from hessviz.plots import drawn_in

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
                st.Page(p.path, title=p.title, icon=p.icon, url_path=p.url_path, default=p.default)
                for p in pages
            ]
            for section, pages in SECTIONS.items()
        },
        position="hidden",
    )  # hva.open_page draws the links, each carrying the view
    # HESSVIZ_RUN_LOG=1: one line per run (hessviz.app.runlog), its wait to be admitted included.
    # admission.admit: the run waits in line for the server (a bounded number of runs at once, each
    # charged its figures and its session's state against the memory limit), or draws the short
    # "the class is full" page and stops, before anything else is drawn.
    with timed(nav.url_path or "hessian_map"), admission.admit(cache.DOOR):
        hva.open_page(nav.url_path or "hessian_map")
        # Figures are laid out in Streamlit's theme from the start (hva.chart shows them in it; a
        # light template first, replaced there, cost 20-50 ms of CPU per figure).
        # warm.serving: while any run is in progress, the background warmer (hessviz.app.warm) waits.
        with drawn_in("host"), warm.serving():
            nav.run()
