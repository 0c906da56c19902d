"""``reproduce``: run every claim, write ``claims.json``, ``report.md``, figures and data.

The report knows the claims, not the app: which page of the app shows a claim is the app's
business (:mod:`hessviz.app.claim_links`).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import pathlib
import time
from collections.abc import Callable, Sequence

import numpy as np

from hessviz.errors import CheckpointError, ConfigError
from hessviz.experiments.common import CLAIM_IDS, Claim, ClaimResult
from hessviz.runtime.tasks import run_tasks

HEADLINES = {
    "xnorm6": ("slope_attention_QQ_outer", "slope_attention_QQ_functional", "slope_attention_VV_outer"),
    "placement": ("slope_attention_QQ_outer_small", "slope_post_QQ_outer_small", "slope_pre_QQ_outer_small"),
    "seqlen": (
        "exponent_QQ_outer_isotropic_xnorm1",
        "exponent_QQ_outer_gaussian_xnorm1",
        "exponent_QQ_full_isotropic_xnorm1",
    ),
    "nonconvex": (
        "outer_min_eig_over_max_abs",
        "fraction_of_cases_full_indefinite",
        "full_negative_mass_post",
    ),
    "ln_collapse": ("exponent_ln_jacobian", "exponent_ln_hessian", "exponent_block_full"),
    "bounds": (
        "violations_total_appendix",
        "adversarial_violations_QQ_outer_appendix",
        "adversarial_violations_QQ_outer_corrected",
    ),
    "gini": ("gini_post_column", "gini_pre_column", "lambda_G_over_P_post_column"),
    "gini_real": ("gini_pydoc-postln_trained", "gini_pydoc-preln_trained", "gini_all-MiniLM-L6-v2_trained"),
    "depth": ("factor_post_QQ_outer", "factor_pre_QQ_outer", "factor_post_QQ_full"),
    "modern": ("slope_pre_rmsnorm_QQ_outer", "slope_attention_rope_QK_outer", "tied_identity_rel_error"),
    "growth_protocol": (
        "slope_none_1layers_l0_W_Q_outer",
        "slope_none_1layers_l0_W_Q_functional",
        "slope_none_1layers_l0_W_V_outer",
    ),
    "gini_protocol": ("gini_pydoc-postln", "gini_pydoc-preln", "ratio_pydoc-postln"),
    "optimizers_protocol": (
        "log_final_ratio_SGD_over_sign_pydoc-postln",
        "log_final_ratio_SGD_over_sign_pydoc-preln",
        "log_final_ratio_SGD_over_sign_pydoc-llama",
    ),
    "smollm2_table": ("top_spread", "mean_top_QK", "mean_top_Norm"),
    "sharpness_ordering": (
        "relations_holding_smollm2-135m",
        "relations_holding_pydoc-preln",
        "relations_holding_pydoc-llama",
    ),
    "gini_smollm2": ("gini_smollm2-135m", "committed_gini_pydoc-postln", "committed_gini_all-MiniLM-L6-v2"),
    "optimizers": (
        "log_final_ratio_SGD_over_SignSGD_post",
        "log_final_ratio_SGD_over_Adam_post",
        "log_final_ratio_SGD_over_SignSGD_pre",
    ),
}
"""Claim -> the measured keys shown in summary tables."""


def headline(entry: dict) -> list[tuple[str, object]]:
    """The headline ``(key, value)`` pairs of a ``claims.json`` entry (first three keys as fallback)."""
    m = entry["measured"]
    keys = [k for k in HEADLINES.get(entry["id"], ()) if k in m] or list(m)[:3]
    return [(k, m[k]) for k in keys]


def claims() -> dict[str, Claim]:
    """Every claim by id, in the order of :data:`CLAIM_IDS`."""
    from hessviz.experiments import (
        bounds,
        depth,
        gini_protocol,
        growth_protocol,
        heterogeneity,
        ln_collapse,
        modern,
        nonconvex,
        optimizers,
        optimizers_protocol,
        scaling,
    )

    found = (
        scaling.XNORM6,
        scaling.PLACEMENT,
        scaling.SEQLEN,
        nonconvex.NONCONVEX,
        ln_collapse.LN_COLLAPSE,
        bounds.BOUNDS,
        heterogeneity.GINI,
        optimizers.OPTIMIZERS_CLAIM,
        depth.DEPTH,
        modern.MODERN,
        growth_protocol.GROWTH_PROTOCOL,
        gini_protocol.GINI_PROTOCOL,
        optimizers_protocol.OPTIMIZERS_PROTOCOL,
    )
    by_id = {c.id: c for c in found}
    return {cid: by_id[cid] for cid in CLAIM_IDS}


def run_claim(cid: str, quick: bool) -> ClaimResult:
    """One claim, timed (``seconds``)."""
    t = time.perf_counter()
    res = claims()[cid].run(quick)
    res.seconds = time.perf_counter() - t
    return res


def run_claims(
    quick: bool = False,
    ids: tuple[str, ...] = CLAIM_IDS,
    progress: Callable[[str], None] | None = None,
    executor: cf.Executor | None = None,
) -> list[ClaimResult]:
    """Run the claims ``ids``; each result carries its runtime in ``seconds``.

    Without ``executor`` they run here, in order. With one (any :class:`concurrent.futures.Executor`:
    a process pool, a Dask ``distributed`` client's ``get_executor()``) each claim is one task
    (:func:`hessviz.runtime.tasks.run_tasks`: under this process's torch thread count, all submitted at
    once); the results come back in the order of ``ids``, with the numbers of the in-process run to
    the bit (every claim seeds its own draws) but for the wall-clock readings some claims record
    (``seconds…``)."""
    known = claims()
    for cid in ids:
        if cid not in known:
            raise ValueError(f"claim id must be one of {', '.join(CLAIM_IDS)}, got {cid!r}")
    if executor is not None:
        return run_tasks(
            executor,
            run_claim,
            [(cid, quick) for cid in ids],
            arrived=None if progress is None else lambda i, _r: progress(f"{ids[i]} done"),
        )
    out = []
    for cid in ids:
        if progress:
            progress(f"{cid} …")
        out.append(run_claim(cid, quick))
    return out


def _holds_text(h) -> str:
    return {True: "holds", False: "does not hold", "partly": "partly"}.get(h, str(h))


def _fmt(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(u) for u in v) + "]"
    a = abs(v)
    if v == int(v) and a < 1e6:
        return str(int(v))
    return f"{v:.3g}" if (a >= 1e-3 and a < 1e4) else f"{v:.3e}"


def write_report(
    results: list[ClaimResult],
    out_dir: pathlib.Path,
    quick: bool,
    seconds: float,
    title: str = "hessviz: the papers' claims, measured",
    command: str = "hessviz reproduce",
    basis: str = "Every number comes from the closed-form Hessians and gradients of hessviz, float64, CPU.",
    pending: tuple[str, ...] = (),
    skipped: dict[str, str] | None = None,
    figures: bool = True,
) -> list[dict]:
    """Write ``claims.json``, ``report.md``, ``figures/*.html`` and ``data/<id>.npz``.

    Called after every claim while a run goes on, so a failure keeps what was done: ``pending``
    names the claims still to come, ``skipped`` the ones left out and why (one line each). The
    figures load plotly.js from ``figures/plotly.min.js``, written once beside them: the report
    reads offline. ``figures=False`` writes none (the package's stored claims: the app draws them from
    ``data/``)."""
    out_dir = pathlib.Path(out_dir)
    if figures:
        (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    (out_dir / "data").mkdir(parents=True, exist_ok=True)
    entries = [r.entry() for r in results]
    (out_dir / "claims.json").write_text(json.dumps(entries, indent=2, ensure_ascii=False) + "\n")
    lines = [
        f"# {title}",
        "",
        f"Generated by `{command}{' --quick' if quick else ''}` in {seconds:.0f} s "
        f"({'quick: fewer seeds and points, numbers are indicative only' if quick else 'full run'}). "
        f"{basis} `claims.json` holds the same records; `data/<id>.npz` the raw arrays behind each figure.",
        "",
    ]
    if pending:
        lines += [f"**Partial:** still running or to come: {', '.join(f'`{c}`' for c in pending)}.", ""]
    for cid, why in (skipped or {}).items():
        lines += [f"**Skipped** `{cid}`: {why}", ""]
    lines += [
        "| claim | holds | key numbers |",
        "|---|---|---|",
    ]
    for r in results:
        nums = "; ".join(f"{k} = {_fmt(v)}" for k, v in headline(r.entry()))
        lines.append(f"| `{r.id}` | {_holds_text(r.holds)} | {nums} |")
    lines.append("")
    for r in results:
        rec = r.entry()
        lines += [
            f"## `{r.id}`: {_holds_text(r.holds)}",
            "",
            f"**Claim.** {r.claim}",
            "",
            f"**Source.** {r.source}",
            "",
            f"**Measured** ({r.seconds:.1f} s):",
            "",
        ]
        lines += [f"- `{k}`: {_fmt(v)}" for k, v in rec["measured"].items()]
        lines += ["", f"**Verdict.** {_holds_text(r.holds)}: {r.rule}.", "", f"**Note.** {r.note}", ""]
        for name, fig in r.figures.items() if figures else ():
            path = out_dir / "figures" / f"{name}.html"
            fig.write_html(str(path), include_plotlyjs="directory", full_html=True)
            lines.append(f"- Figure: [{name}](figures/{name}.html)")
        if r.data:
            np.savez_compressed(
                out_dir / "data" / f"{r.id}.npz", **{k: np.asarray(v) for k, v in r.data.items()}
            )
            lines.append(f"- Data: [data/{r.id}.npz](data/{r.id}.npz)")
        lines.append("")
    (out_dir / "report.md").write_text("\n".join(lines))
    return entries


def run_and_write(
    claims: Sequence[Claim],
    out_dir: pathlib.Path,
    quick: bool,
    *,
    stored: Callable[[str], bool] = lambda cid: True,
    figures: bool = True,
    **about: str,
) -> list[dict]:
    """Run ``claims`` here, in order, and :func:`write_report` them (``about``: its ``title``,
    ``command`` and ``basis``). A claim that reads stored numbers (``stored(id)``) whose file is missing
    is left out, with one line; any other claim's missing file is an error."""
    results, start = [], time.perf_counter()
    for c in claims:
        t = time.perf_counter()
        try:
            r = c.run(quick)
        except FileNotFoundError as e:
            if not stored(c.id):
                raise
            print(f"{c.id}: {e}", flush=True)
            continue
        r.seconds = time.perf_counter() - t
        results.append(r)
    return write_report(results, out_dir, quick, time.perf_counter() - start, figures=figures, **about)


def reproduce(
    out_dir: pathlib.Path,
    quick: bool = False,
    executor: cf.Executor | None = None,
    log: Callable[[str], None] | None = None,
    ids: tuple[str, ...] = CLAIM_IDS,
    figures: bool = True,
) -> list[dict]:
    """Run the claims ``ids`` (default: every claim) and write ``out_dir/claims.json`` and
    ``out_dir/report.md`` (with figures, unless ``figures=False``).

    ``quick=True`` uses fewer seeds, points and steps (minutes); the full run takes longer on two
    CPU cores. Run here, the report is written again after every claim, so a failure or an
    interruption keeps the claims done; a claim whose model is not installed is skipped, with one
    line to ``log`` and one in the report. ``executor``: run the claims as tasks on it
    (:func:`run_claims`; the report is written once they are all back). Returns the entries of
    ``claims.json``.
    """
    out_dir, t = pathlib.Path(out_dir), time.perf_counter()
    unknown = sorted(set(ids) - set(CLAIM_IDS))
    if unknown:
        raise ConfigError(f"no claim {', '.join(unknown)}: the claims are {', '.join(CLAIM_IDS)}")
    if executor is not None:
        results = run_claims(quick, ids, executor=executor)
        return write_report(results, out_dir, quick, time.perf_counter() - t, figures=figures)
    results, skipped = [], {}
    entries = write_report(results, out_dir, quick, 0.0, pending=ids, figures=figures)
    for i, cid in enumerate(ids):
        try:
            result = run_claim(cid, quick)
        except CheckpointError as e:  # a bundled model that is not installed here
            skipped[cid] = str(e)
            if log:
                log(f"{cid}: skipped: {e}")
            continue
        results.append(result)
        if log:
            log(f"{cid:<20} holds={result.holds!s:<8} {result.seconds:6.1f} s  {result.claim}")
        pending = ids[i + 1 :]
        entries = write_report(
            results,
            out_dir,
            quick,
            time.perf_counter() - t,
            pending=pending,
            skipped=skipped,
            figures=figures,
        )
    return entries
