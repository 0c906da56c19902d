"""Command line: ``hessviz compute | verify | spectrum | models | bench | reproduce | lesson | app``.

Examples::

    hessviz models                                           # bundled models and supported families
    hessviz verify --model pydoc-llama --layer 1 --text "def add(a, b):" --wrt "W_Q[0]"
    hessviz spectrum --model ~/models/SmolLM-135M --layer 3 --text "The cat sat" --top 5
    hessviz compute --model pydoc-preln --layer 3 --ids 5 81 2 17 --objective next_token --wrt W_O

    hessviz compute --norm pre -L 8 -d 16 --out out/pre      # out/pre.npz + out/pre.json
    hessviz verify --norm post --activation gelu --loss ce   # closed form vs autograd table
    hessviz spectrum --norm post -L 32 -d 384 --heads 12 --d-k 32 --d-ff 1536 --out-proj \\
        --bias --ln-affine --activation gelu --top 5 --density   # spectrum.json + .html
    hessviz bench --out benchmarks               # RESULTS.md, MATFREE.md, PRETRAINED.md, BUDGET.md, LLM.md
    hessviz reproduce --quick --out reproduce-out            # the papers' claims, measured
    hessviz lesson "http://localhost:8501/spectrum?norm=post" --out spectrum.html   # reads offline
    hessviz app                                              # the app (needs hessviz[app])
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

import hessviz as hv
from hessviz.block.config import BLOCK_SETTINGS
from hessviz.block.terms import TERMS
from hessviz.checks import cost
from hessviz.commands.guard import Price, Setup, check_out, guard
from hessviz.commands.options import DTYPES, add_block_args
from hessviz.errors import HessvizError
from hessviz.losses import names
from hessviz.matfree import spectra
from hessviz.runtime.tasks import usable_cores


def _model_setup(args: argparse.Namespace, dtype: torch.dtype, device: str, price: Price) -> Setup:
    """Layer ``--layer`` of ``--model`` on ``--text`` / ``--ids`` (:func:`hessviz.layer_for_text`),
    once the run on its tokens is known to fit (:func:`_guard`: the block and the token count come
    from the checkpoint's config and its tokenizer, nothing of the text's size is computed first)."""
    from hessviz import pretrained
    from hessviz.pretrained import objectives

    if (args.text is None) == (args.ids is None):
        raise hv.InputError("--model needs exactly one of --text and --ids (the tokens entering the layer)")
    given = args.text if args.text is not None else args.ids
    info = pretrained.model_info(args.model)
    ids = pretrained.token_ids(args.model, given)
    objective = names.objective(args.objective)
    if objective is not None and args.layer != info.n_layers - 1:
        raise hv.ConfigError(
            f"--objective {args.objective} is the model's loss on its last hidden states: "
            f"use --layer {info.n_layers - 1}"
        )
    planned = dataclasses.replace(info.block, seq_len=len(ids), loss=args.loss)
    itemsize = torch.empty((), dtype=dtype).element_size()
    guard(
        args,
        planned,
        price,
        device,
        before=cost.hidden_states_bytes(planned, info.vocab_size, itemsize),
        beside=0 if objective is None else cost.next_token_bytes(planned, info.vocab_size, itemsize),
    )
    cfg, params, X = hv.layer_for_text(args.model, ids, args.layer, dtype=dtype, device=device)
    cfg = dataclasses.replace(cfg, loss=args.loss)
    Y, custom = None, None
    if objective is not None:
        Z = hv.forward(cfg, params, X)
        head = objectives.lm_head(args.model, dtype)
        custom = objective.at_text(Z, ids, head).custom_loss(blocks=True)
    else:
        _, Y = hv.sample_inputs(cfg, seed=args.seed, dtype=dtype, device=device)
    title = f"{info.name} layer {args.layer} ({info.family}), {cfg.describe()}, {args.objective} objective"
    provenance = {
        "model": info.name,
        "folder": info.folder,
        "layer": args.layer,
        "objective": args.objective,
        "ids": ids,
    }
    return Setup(cfg, params, X, Y, custom, tuple(args.wrt) if args.wrt else None, title, provenance)


def _setup(args: argparse.Namespace, price: Price) -> Setup:
    """The block, its weights and its input, built once the command's whole run (``price``) is known
    to fit the memory limit (:func:`_guard`)."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[args.dtype]
    if args.model is not None:
        return _model_setup(args, dtype, device, price)
    if args.text is not None or args.ids is not None or args.objective != names.SYNTHETIC:
        raise hv.InputError(
            "--text, --ids and --objective need --model (a checkpoint folder or a bundled model)"
        )
    cfg = hv.BlockConfig(**{s.name: getattr(args, s.name) for s in BLOCK_SETTINGS})
    guard(args, cfg, price, device)
    params = hv.init_params(cfg, seed=args.seed, dtype=dtype, device=device)
    X, Y = hv.sample_inputs(cfg, seed=args.seed, input_norm=args.input_norm, dtype=dtype, device=device)
    wrt = tuple(args.wrt) if args.wrt else None
    return Setup(cfg, params, X, Y, None, wrt, cfg.describe(args.input_norm), {"input_norm": args.input_norm})


BENCH_SUITES = ("dense", "matfree", "pretrained", "budget", "llm")


def summarize(res: hv.HessianResult, terms: tuple[str, ...]) -> dict:
    """Block norms, extreme eigenvalues and negative-eigenvalue count per term."""
    out = {}
    for term in terms:
        spec = spectra.eigenvalues(res.term(term))
        neg = spectra.negative_summary(spec)
        out[term] = {
            "block_norms_spectral": spectra.block_norms(res, term, "spectral").tolist(),
            "block_norms_fro": spectra.block_norms(res, term, "fro").tolist(),
            "min_eigenvalue": neg.min_eigenvalue,
            "max_eigenvalue": neg.max_eigenvalue,
            "negative_eigenvalues": neg.count,
            "negative_mass": neg.mass,
            "eigenvalue_method": spec.method,
        }
    return out


def cmd_compute(args: argparse.Namespace) -> int:
    terms = tuple(dict.fromkeys(args.terms))
    out = Path(args.out)
    check_out(out, (out.with_suffix(".npz"), out.with_suffix(".json")), force=None, create=True)
    run = _setup(args, lambda cfg, names, itemsize: cost.dense_terms_bytes(cfg, names, len(terms), itemsize))
    cfg, X = run.cfg, run.X
    start = time.perf_counter()
    res = hv.hessian(cfg, run.params, X, run.Y, wrt=run.wrt, loss=run.custom)
    arrays = {t: res.term(t).cpu().numpy() for t in terms}
    seconds = time.perf_counter() - start
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out.with_suffix(".npz"),
        **arrays,
        names=np.array(res.names),
        sizes=np.array([cfg.param_size(n) for n in res.names]),
    )
    summary = {
        "config": cfg.values(),
        **run.provenance,
        "seed": args.seed,
        "dtype": args.dtype,
        "device": str(X.device),
        "names": list(res.names),
        "P": res.size,
        "seconds": seconds,
        "terms": summarize(res, terms),
    }
    out.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    print(
        json.dumps(
            {k: summary[k] for k in ("names", "P", "seconds")}
            | {
                t: {k: v for k, v in s.items() if not k.startswith("block_norms")}
                for t, s in summary["terms"].items()
            },
            indent=2,
        )
    )
    print(f"wrote {out.with_suffix('.npz')} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from hessviz.checks.verify import compare

    run = _setup(args, cost.comparison_bytes)
    if run.custom is not None:
        raise hv.InputError(
            "verify compares against autograd of the block's own loss: use --objective "
            "synthetic (compute and spectrum take next_token)"
        )
    tol = args.tol if args.tol is not None else (1e-10 if args.dtype == "float64" else 1e-4)
    result = compare(run.cfg, run.params, run.X, run.Y, run.wrt)
    print(f"{run.title}  ({args.dtype}, {run.X.device})")
    print(f"{'term':<12}{'block':<12}{'relative error':>16}")
    for what, block, err in result.table():
        flag = "" if err <= tol else "  <-- above tolerance"
        print(f"{what:<12}{block:<12}{err:>16.2e}{flag}")
    ok = result.worst <= tol
    print(
        f"worst relative error {result.worst:.2e} (tolerance {tol:.0e}): {'OK' if ok else 'FAIL'}; "
        f"all three terms: closed form {result.seconds['closed_form'] * 1e3:.1f} ms, autograd "
        f"{result.seconds['autograd'] * 1e3:.1f} ms ({result.speedup:.1f}×)"
    )
    return 0 if ok else 1


def cmd_spectrum(args: argparse.Namespace) -> int:
    from hessviz.matfree.report import spectrum_figure, spectrum_report

    out = Path(args.out)
    check_out(out, (out.with_suffix(".json"), out.with_suffix(".html")), force=None, create=True)
    run = _setup(
        args,
        lambda cfg, names, itemsize: cost.spectrum_report_bytes(
            cfg,
            names,
            top=args.top,
            bottom=args.bottom,
            density=args.density,
            probes=args.probes,
            steps=args.steps,
            trace=args.trace,
            blocks=args.blocks,
            itemsize=itemsize,
        ),
    )
    cfg, X = run.cfg, run.X
    res = hv.hessian(cfg, run.params, X, run.Y, wrt=run.wrt, loss=run.custom)
    print(f"{run.title}: P = {res.size:,}", file=sys.stderr)

    def progress(done: int, total: int | None, message: str) -> None:
        if sys.stderr.isatty():
            print(f"\r  {message[:100]:<100}", end="", file=sys.stderr)

    report = spectrum_report(
        res,
        args.term,
        args.top,
        args.bottom,
        args.density,
        args.probes,
        args.steps,
        args.trace,
        args.blocks,
        args.seed,
        progress,
    )
    if sys.stderr.isatty():
        print(file=sys.stderr)
    report |= {"config": cfg.values(), **run.provenance, "device": str(X.device)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    spectrum_figure(report, f"{args.term} Hessian: {run.title}, P = {res.size:,}").write_html(
        out.with_suffix(".html"),
        include_plotlyjs=True,  # plotly.js inside: the page reads offline
    )
    for which in ("top", "bottom"):
        if which in report:
            r = report[which]
            values = r["values"][::-1] if which == "top" else r["values"]
            print(
                f"{which} {len(values)}: {', '.join(f'{v:.6g}' for v in values)} "
                f"({r['matvecs']} products, {r['seconds']:.1f} s)"
            )
    if "density" in report:
        r = report["density"]
        print(
            f"density: {r['probes']} probes x {r['steps']} steps ({r['matvecs']} products, "
            f"{r['seconds']:.1f} s); SLQ trace {r['trace_estimate']:.6g}"
        )
    if "trace" in report:
        r = report["trace"]
        print(f"trace (Hutch++): {r['value']:.6g} ± {r['stderr']:.2g} ({r['matvecs']} products)")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.html')}", file=sys.stderr)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """The bundled models present here (one line each) and the checkpoint families hessviz reads."""
    from hessviz import pretrained
    from hessviz.pretrained.families import FAMILIES

    print("bundled models (hessviz --model NAME):")
    for name in pretrained.available_models():
        try:
            print(f"  {pretrained.model_info(name).describe()}")
        except HessvizError as e:  # installed but unreadable here (a GGUF file without the models extra)
            print(f"  {name}: {e}")
    missing = [n for n in pretrained.BUNDLED if n not in pretrained.available_models()]
    if missing:
        print(f"  (not installed here: {', '.join(missing)})")
    print("checkpoint folders (config.json + model.safetensors) of these model_type values:")
    for family in FAMILIES:
        print(f"  {', '.join(family.model_types):<16} {family.title}: {family.blurb}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if "dense" in args.suite:
        from hessviz.bench import dense

        dense.main(
            out=out / "RESULTS.md", seq_lens=tuple(args.seq_lens), repeats=args.repeats, threads=args.threads
        )
    if "matfree" in args.suite:
        from hessviz.bench import matfree, matfree_spectra

        matfree.main(out=out / "MATFREE.md", repeats=max(args.repeats, 7), threads=args.threads)
        matfree_spectra.main(out / "MATFREE.md", threads=args.threads, repeats=max(args.repeats, 5))
        print(f"wrote {out / 'MATFREE.md'}")
    if "pretrained" in args.suite:
        from hessviz.bench import pretrained

        text = pretrained.main(repeats=max(args.repeats, 5), threads=args.threads)
        (out / "PRETRAINED.md").write_text(f"# Pretrained layers\n\n{text}\n")
        print(f"wrote {out / 'PRETRAINED.md'}")
    if "budget" in args.suite:
        from hessviz.app import budget_bench

        text = budget_bench.main(repeats=args.repeats)
        (out / "BUDGET.md").write_text(f"# The app budget's estimates against measured CPU\n\n{text}\n")
        print(f"wrote {out / 'BUDGET.md'}")
    if "llm" in args.suite:
        from hessviz.bench import llm

        text = llm.main(
            tuple(args.llm_lengths),
            quick=args.quick,
            threads=args.threads,
            source=args.llm_source,
            device=args.device,
        )
        (out / "LLM.md").write_text(f"# A real LLM's products against autograd's\n\n{text}")
        print(text, end="")
        print(f"wrote {out / 'LLM.md'}")
    return 0


def _claim_choice(args: argparse.Namespace) -> dict:
    """``reproduce``'s ``ids`` and ``figures`` from ``--only`` and ``--no-figures``."""
    from hessviz.experiments.common import CLAIM_IDS

    return {"ids": tuple(args.only or CLAIM_IDS), "figures": not args.no_figures}


def cmd_reproduce(args: argparse.Namespace) -> int:
    from hessviz.experiments import reproduce

    printed = False
    if args.smollm2:
        from hessviz.experiments import smollm2

        claims = smollm2.main(Path(args.out), quick=args.quick, figures=not args.no_figures)
    elif args.gemma3:
        from hessviz.experiments import llm

        claims = llm.main("gemma3-270m", Path(args.out), quick=args.quick, figures=not args.no_figures)
    elif args.scheduler is None:
        claims, printed = (
            reproduce(
                Path(args.out), quick=args.quick, log=lambda s: print(s, flush=True), **_claim_choice(args)
            ),
            True,
        )
    else:
        try:
            from distributed import Client
        except ImportError:
            raise hv.InputError(
                "--scheduler needs Dask's distributed: pip install 'hessviz[cluster]'"
            ) from None
        try:
            client = Client(args.scheduler, timeout=10)
        except (OSError, TimeoutError, ValueError) as e:
            raise hv.InputError(
                f"--scheduler {args.scheduler}: no Dask scheduler answers there ({e})"
            ) from None
        with client:
            claims = reproduce(
                Path(args.out), quick=args.quick, executor=client.get_executor(), **_claim_choice(args)
            )
    for c in [] if printed else claims:
        print(f"{c['id']:<12} holds={c['holds']!s:<8} {c['claim']}")
    print(f"wrote {Path(args.out) / 'claims.json'} and {Path(args.out) / 'report.md'}")
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    import importlib.util

    missing = [m for m in ("streamlit", "pandas", "pyarrow") if importlib.util.find_spec(m) is None]
    if missing:
        raise hv.InputError(
            f"the app needs {', '.join(missing)}, which are not installed: pip install 'hessviz[app]'"
        )
    if args.profile:
        os.environ["HESSVIZ_PROFILE"] = args.profile
    from hessviz.app import serve

    return serve.run(args.streamlit)


def cmd_lesson(args: argparse.Namespace) -> int:
    import logging

    logging.getLogger("streamlit").setLevel(logging.ERROR)  # "no script run context": not run by Streamlit
    out = Path(args.out)
    check_out(out, (out,), force=args.force, create=False)  # before the build, not after it
    from hessviz.app import lesson_page

    start = time.perf_counter()

    def progress(done: int, total: int, text: str) -> None:
        if not args.quiet:
            print(f"  {text} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)

    import torch

    torch.set_num_threads(1)  # small blocks: one thread each, the points spread over processes
    size = lesson_page.write(args.url, args.out, progress=progress, workers=args.workers)
    print(f"wrote {args.out}: {size / 2**20:.2f} MiB in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hessviz",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compute", help="Hessian terms to .npz and a JSON summary")
    add_block_args(p)
    p.add_argument("--terms", nargs="+", choices=tuple(TERMS), default=list(TERMS))
    p.add_argument("--out", default="out/hessian", help="output path prefix (default out/hessian)")
    p.set_defaults(func=cmd_compute)

    p = sub.add_parser("verify", help="closed form vs autograd, relative error per block and term")
    add_block_args(p)
    p.add_argument("--tol", type=float, default=None, help="fail above this (default 1e-10 in float64)")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "spectrum",
        help="matrix-free spectrum at any size: Lanczos eigenvalues, SLQ density, "
        "trace; writes JSON and an HTML figure",
    )
    add_block_args(p)
    p.add_argument("--term", choices=tuple(TERMS), default="full")
    p.add_argument("--top", type=int, default=5, help="largest eigenvalues by Lanczos (default 5)")
    p.add_argument("--bottom", type=int, default=0, help="smallest eigenvalues by Lanczos (default 0)")
    p.add_argument("--density", action="store_true", help="spectral density by SLQ")
    p.add_argument("--probes", type=int, default=10, help="SLQ probe vectors (default 10)")
    p.add_argument("--steps", type=int, default=80, help="Lanczos steps per SLQ probe (default 80)")
    p.add_argument(
        "--trace",
        type=int,
        default=0,
        metavar="SAMPLES",
        help="Hutch++ trace from this many products (default: none)",
    )
    p.add_argument("--blocks", action="store_true", help="top eigenvalue and trace of every weight and head")
    p.add_argument("--out", default="out/spectrum", help="output path prefix (default out/spectrum)")
    p.set_defaults(func=cmd_spectrum)

    p = sub.add_parser("models", help="the bundled models and the checkpoint families --model reads")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser(
        "bench",
        help="closed form vs the strongest autograd, side by side; writes "
        "benchmarks/RESULTS.md, MATFREE.md, PRETRAINED.md, BUDGET.md and LLM.md",
    )
    p.add_argument("--out", default=".", help="folder of the result files (default: the working directory)")
    p.add_argument(
        "--suite",
        nargs="+",
        choices=BENCH_SUITES,
        default=list(BENCH_SUITES),
        help="dense Hessians (RESULTS.md, ~8 min), matrix-free products and spectra "
        "(MATFREE.md, ~20 min), pretrained layers: loading, hidden states, a head slice's "
        "dense Hessian, top-5 of a whole layer (PRETRAINED.md, ~5 min), the app budget's "
        "estimates against measured CPU (BUDGET.md, ~30 s), a real LLM's products, columns, traces and "
        "per-tensor table against kept-graph autograd (LLM.md, SmolLM2-135M); default all",
    )
    p.add_argument("--seq-lens", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument(
        "--llm-lengths",
        type=int,
        nargs="+",
        default=[16, 64, 256],
        help="token counts of the llm suite's whole-model products (SmolLM2-135M; default 16 64 256)",
    )
    p.add_argument(
        "--llm-source",
        default="smollm2-135m",
        help="llm suite: the model (default the bundled SmolLM2-135M; or a checkpoint folder of its shapes, "
        "as scripts/gpu_llm.sh writes where the bundled file cannot go)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="llm suite: where both sides compute (cuda: ratios of synchronised wall time)",
    )
    p.add_argument(
        "--quick", action="store_true", help="llm suite: the first length, one round, few columns (a check)"
    )
    p.add_argument("--repeats", type=int, default=3, help="timed warm runs per case (median)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("reproduce", help="measure the papers' claims; writes claims.json and report.md")
    p.add_argument("--quick", action="store_true", help="fewer seeds, points and steps (minutes, not hours)")
    p.add_argument(
        "--out",
        default="reproduce-out",
        help="the report's folder, written after every claim (default: reproduce-out, in the working dir)",
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="CLAIM",
        help="run these claims only (ids as in claims.json, e.g. gini_protocol depth); default: every claim",
    )
    p.add_argument(
        "--no-figures",
        action="store_true",
        help="write no HTML figures (claims.json, report.md and data/ only; the app draws the figures)",
    )
    p.add_argument(
        "--smollm2",
        action="store_true",
        help="the three SmolLM2-135M claims instead (needs its GGUF, the models extra; reads the "
        "table stored by python -m hessviz.experiments.llm_table; minutes)",
    )
    p.add_argument(
        "--gemma3",
        action="store_true",
        help="the two Gemma 3 270M claims instead (Wang et al.'s sharpness under four metrics, the Gini with "
        "intervals), from the numbers stored by python -m hessviz.experiments.sharpness and the Gini's "
        "gradients; seconds)",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run the claims as tasks on a Dask cluster, e.g. tcp://scheduler:8786 (needs the "
        "cluster extra; the workers must import hessviz)",
    )
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser(
        "app",
        help="serve the app (Streamlit) from the installed package",
        description="Serve the app on http://127.0.0.1:8501 (loopback) until interrupted. Every other "
        "option is Streamlit's, passed through: --server.port 8600, --server.address 0.0.0.0 (another "
        "address: set --profile hosted for a public link).",
        epilog="Needs the app's extra: pip install 'hessviz[app]'.",
    )
    p.add_argument(
        "--profile",
        choices=("local", "hosted"),
        default=None,
        help="the server's limits (default: $HESSVIZ_PROFILE, else local on loopback and hosted on any "
        "other address)",
    )
    p.set_defaults(func=cmd_app, streamlit=[])

    p = sub.add_parser(
        "lesson",
        help="a lesson link as one self-contained HTML page (plotly.js inline, no server)",
        description="Write the view of a lesson link (the URL the app's 'Make a lesson link' panel gives, "
        "e.g. '/scaling?norm=attention&hide=norm,L', or the whole http:// address) as one HTML "
        "file that opens offline. A few of the controls the lesson leaves open are computed for "
        "each of their values and baked into the page (the placement, the block, the axis, the "
        "loss, LayerNorm eps); the page says what it covers. Pages: scaling, spectrum, "
        "layernorm_collapse. A value the app does not offer is refused with the app's line, and "
        "nothing is written. See docs/classroom.md.",
    )
    p.add_argument("url", help="the lesson link, e.g. '/scaling?norm=attention&hide=norm,L'")
    p.add_argument(
        "--out",
        required=True,
        help="the HTML file to write (written whole or not at all), in a folder that exists; an existing "
        "file only with --force",
    )
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--workers",
        type=int,
        default=min(4, usable_cores()),
        help="processes computing the sweep points (default: the cores this process may use, at most 4)",
    )
    p.set_defaults(func=cmd_lesson)
    return parser


ALLOCATOR_WORDS = ("not enough memory", "can't allocate memory", "out of memory", "DefaultCPUAllocator")
"""What torch's allocators say when an allocation fails (``RuntimeError``, ``torch.OutOfMemoryError``)."""


def out_of_memory(err: BaseException) -> str:
    """One line for an allocation that failed although the estimate said the run fits (``""`` when
    ``err`` is something else): Python's ``MemoryError`` (numpy's too), or the ``RuntimeError`` of
    torch's allocators, whose text (``[enforce fail at alloc_cpu.cpp:127] err == 0.
    DefaultCPUAllocator: can't allocate memory: you tried to allocate 80000000000 bytes. …``) is kept
    from the allocator's name on."""
    text = " ".join(str(err).split())
    if not isinstance(err, MemoryError) and not any(w.lower() in text.lower() for w in ALLOCATOR_WORDS):
        return ""
    if "DefaultCPUAllocator" in text:  # c10's "[enforce fail at file:line] condition." before it
        text = text[text.index("DefaultCPUAllocator") :]
    return (
        f"out of memory ({text[:200] or type(err).__name__}); set HESSVIZ_MEMORY_LIMIT below the free "
        f"memory to have such a run refused before it starts, or make it smaller"
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "app":  # only `hessviz app` passes options on (to Streamlit)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.streamlit = extra
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, so that a closed pipe is caught below, not at exit
        return code
    except HessvizError as err:
        print(f"hessviz {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as err:
        if not out_of_memory(err):
            raise
        print(f"hessviz {args.command}: error: {out_of_memory(err)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `hessviz models | head -3`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141  # 128 + SIGPIPE, as a shell reports a command killed by a closed pipe


if __name__ == "__main__":
    raise SystemExit(main())
