"""Claims: the papers' statements, each with the numbers we measured and a link to the page that shows it."""

import json

import streamlit as st

from hessviz import app as hva
from hessviz.app.claim_links import link
from hessviz.experiments import CLAIM_IDS
from hessviz.experiments.report import headline
from hessviz.resources import data

COMMITTED = data("claims", "claims.json")
HOLDS = {True: "✓ holds", False: "✗ does not hold", "partly": "◐ partly"}

CONFIGURATION = (
    "Measured once, by `hessviz reproduce`, on each claim's own blocks, sizes and seeds (its note and "
    "numbers name them), not on the sidebar's block: the sidebar does not change this page. Each "
    "*open page* link opens the view that shows its claim."
)
"""What the header says in place of a block: the claims are not the sidebar's configuration."""

hva.sidebar()  # kept for the links and the other pages; it describes no block of this page
with hva.header("The papers' claims, measured"):
    st.caption(CONFIGURATION)
hva.explain(
    "Each row is one statement from Petrov et al. (full-block Hessian), Ormaniec et al. (self-attention "
    "Hessian) or Tomihari & Sato (gradient heterogeneity), measured with hessviz's exact Hessians over seeds "
    "and configurations. The numbers come from `hessviz reproduce` (committed with the "
    "app); *holds* is our verdict, and the note says where our numbers differ from the paper's. Slopes are "
    "log–log least-squares fits with 95 % intervals over seeds.",
    r"\|H\|\propto x^{s}\ \Longleftrightarrow\ \log\|H\| = s\log x + c",
)


records = None
source = ""
if COMMITTED.exists():
    records = hva.cache.claims_file(str(COMMITTED), COMMITTED.stat().st_mtime)
    source = "`hessviz/data/claims/claims.json`, the full run shipped with hessviz"
else:
    st.info(
        "No stored report found (`hessviz/data/claims/claims.json`: reinstall hessviz). Run `hessviz "
        "reproduce`, or compute a quick version here (about a minute).",
        icon=":material/info:",
    )
    if st.button("Run the quick reproduction", icon=":material/play_arrow:"):
        with hva.guard("the quick reproduction"):
            records = hva.cache.claims_quick(0)
        source = "a quick run in this session (fewer seeds: indicative only)"
if not records:
    st.stop()

c1, c2 = st.columns([2, 3])
show = hva.choice("Show", ("all", "holds", "partly", "fails"), key="cl_show", default="all", container=c1)
want = {"all": None, "holds": True, "partly": "partly", "fails": False}[show]
rows = [r for r in records if want is None or r["holds"] == want]
st.caption(f"Source: {source}. {len(rows)} of {len(records)} claims shown.")


def _fmt(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(u) for u in v) + "]"
    return f"{v:.4g}"


table = {
    "claim": [r["id"] for r in rows],
    "statement": [r["claim"] for r in rows],
    "verdict": [HOLDS.get(r["holds"], str(r["holds"])) for r in rows],
    "key numbers": ["; ".join(f"{k} = {_fmt(v)}" for k, v in headline(r)) for r in rows],
    "see it": [link(r["id"]) for r in rows],
}
st.dataframe(
    table,
    hide_index=True,
    width="stretch",
    column_config={
        "see it": st.column_config.LinkColumn("see it", display_text="open page"),
        "statement": st.column_config.TextColumn(width="large"),
    },
)
hva.downloads("claims", csv=lambda: table, npz=None)
st.download_button(
    "claims.json",
    json.dumps(records, indent=2, ensure_ascii=False),
    "claims.json",
    "application/json",
    icon=":material/download:",
    on_click="ignore",
)

ids = [r["id"] for r in records]
pick = hva.select("Details of", tuple(i for i in CLAIM_IDS if i in ids), key="cl_id", default=ids[0])
rec = next(r for r in records if r["id"] == pick)
st.subheader(f"`{rec['id']}`: {HOLDS.get(rec['holds'], rec['holds'])}")
st.markdown(f"**Claim.** {rec['claim']}  \n**Source.** {rec['source']}")
st.markdown(f"**Note.** {rec['note']}")
st.markdown(f"[Open the page that shows it]({link(rec['id'])})")
st.dataframe(
    {"measured": list(rec["measured"]), "value": [_fmt(v) for v in rec["measured"].values()]},
    hide_index=True,
    width="stretch",
)
