"""A lesson link as one self-contained HTML page that needs no server (``hessviz lesson``).

The page is made from the same URL a lesson link uses (``/scaling?norm=attention&hide=norm,L``):
the URL is settled exactly as the app settles it (:class:`hessviz.app.address.Address`), a value
the app does not offer is refused with the app's own line (:class:`LessonError`). Then a few of
the controls the lesson leaves open are *baked*: the view is computed, with the page's own
functions (:mod:`hessviz.app.views`), for every combination of their values, and every figure is
written into the file as JSON. The file holds plotly.js inline and a few lines of script that, when
a baked control moves, draw the figures of the new combination (``Plotly.react``): nothing is
loaded from the network, nothing is computed in the browser.

Which controls are baked is chosen per page so that the page stays small and quick to make (the
figures of one combination are 10–150 KB of JSON; plotly.js alone is 4.6 MiB); the page says what
it covers and which controls are fixed. A combination that the block cannot take (a weight the
placement removes) is shown as unavailable. A page whose baked grid would pass
:data:`LIMIT_BYTES` is refused with the control to fix, before its figures are computed.

Pages offered: :data:`PAGES` (every page a tour stop uses, :mod:`hessviz.app.tour`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import itertools
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import plotly.graph_objects as go

import hessviz as hv
from hessviz import plots
from hessviz.app import address, budget, registry, state, views
from hessviz.app.address import Address
from hessviz.app.settings import EPS_GRID
from hessviz.app.state import View
from hessviz.block.terms import NAMES
from hessviz.checks.cost import Cost
from hessviz.laws import sweeps
from hessviz.matfree.spectra import DENSE_LIMIT
from hessviz.plots import modebar
from hessviz.runtime.memory import format_bytes

LIMIT_BYTES = 8 << 20
"""The largest lesson page written."""
AIM_BYTES = 5 << 20
"""The size a lesson page aims for (plotly.js is ~4.6 MiB of it)."""
DIGITS = 5
"""Significant digits of each number written (a chart needs no more; float64 text is 17)."""


class LessonError(hv.HessvizError):
    """The lesson URL cannot be made into a page (one line, naming the field)."""


@dataclass(frozen=True)
class Baked:
    """A control baked into the page: its URL key, label, the values offered and how each reads."""

    key: str
    label: str
    values: tuple
    texts: tuple[str, ...]
    slider: bool = False
    """A slider (ordered numbers) rather than a row of buttons."""


@dataclass
class Drawn:
    """What one combination of the baked values shows: the figures (name, figure) and lines of text."""

    figures: list[tuple[str, go.Figure]]
    lines: list[str] = field(default_factory=list)


@dataclass
class Settled:
    """A lesson URL as the app reads it: the page, the shared values, the page's values, the flags."""

    page: str
    shared: dict[str, object]
    values: dict[str, object]
    lesson: address.Lesson
    query: address.Query

    def view(self, changes: dict[str, object] | None = None, stacks: bool = True) -> View:
        """The page's view, with shared ``changes`` (URL keys); the settings a page does not show
        (the depth, without ``stacks``) take their defaults, as in :func:`hessviz.app.sidebar`."""
        values = {**self.shared, **(changes or {})}
        drawn = {s.url for s in state.APP_SETTINGS.values() if stacks or not s.stacks_only}
        reconciled, _ = state.reconcile(values)
        return View.from_values({k: v for k, v in reconciled.items() if k in drawn})

    def open(self, key: str) -> bool:
        """Whether the lesson leaves the control ``key`` to the students (not hidden)."""
        if self.lesson.hides(key):
            return False
        return self.lesson.sidebar if key in state.APP_SETTINGS else True


class LessonSpec:
    """How one page becomes a lesson page. Subclasses name the page and define :meth:`settle`
    (its own controls, as the page settles them), :meth:`bake`, :meth:`draw` and :meth:`covers`."""

    page = ""
    stacks = True

    def settle(self, here: Address, shared_view: View) -> dict[str, object]:
        raise NotImplementedError

    def bake(self, s: Settled) -> list[Baked]:
        raise NotImplementedError

    def draw(self, view: View, values: dict[str, object]) -> Drawn:
        raise NotImplementedError

    def covers(self, s: Settled, baked: list[Baked]) -> str:
        raise NotImplementedError

    def swept(self, s: Settled, baked: list[Baked]) -> set[str]:
        """The shared settings a chart of the page runs along its x axis (none by default): the
        header never calls them fixed (a sweep in L is not 'Fixed: L = 8')."""
        return set()

    def cost(self, view: View, values: dict[str, object]) -> Cost:
        """What :meth:`draw` computes for one combination, priced as its page prices the view
        (:func:`hessviz.app.budget.cost`), before anything runs; raises what :meth:`draw` would
        raise for a combination the block cannot take (:mod:`hessviz.app.lesson_build` prices a
        build as the sum of these)."""
        raise NotImplementedError

    def points(self, view: View, values: dict[str, object]) -> list[tuple]:
        """The sweep points :meth:`draw` reads (:func:`hessviz.app.cache.prime_sweep_points` computes
        them ahead, on several processes); none by default."""
        return []


def _choice(here: Address, key: str, options: Sequence[str], default: str) -> str:
    value = here.page_value(key, default, lambda t: state.settle(key, t, default, options=tuple(options)))
    if value not in options:
        here.notes.append(f"{key}: {state.shown(str(value))} is not offered here: used {default}.")
        return default
    return value


def _int(here: Address, key: str, lo: int, hi: int, default: int) -> int:
    return int(here.page_value(key, default, lambda t: state.settle(key, t, default, int_range=(lo, hi))))


def _first(link: object, others: Sequence, limit: int) -> tuple:
    """The link's own value first, then ``others`` (without it), ``limit`` values at most."""
    return tuple(dict.fromkeys([link, *others]))[:limit]


def _placement(link: str) -> Baked:
    """The LayerNorm placement as a baked control: the link's own first, then the three the Scaling
    page sets side by side."""
    norms = _first(link, views.PLACEMENTS, 4)
    return Baked("norm", state.APP_SETTINGS["norm"].label, norms, norms)


class ScalingLesson(LessonSpec):
    """The Scaling page: the sweep's own axis is covered by each chart; baked are the placement
    (attention, Post-LN, Pre-LN), up to three blocks and the axis (‖X‖₂ and L, the two the theory
    gives an exponent for)."""

    page = "scaling"
    BLOCKS = ("W_Q,W_Q", "W_K,W_K", "W_Q,W_K")

    def settle(self, here: Address, shared_view: View) -> dict[str, object]:
        axis = _choice(here, "sc_axis", tuple(sweeps.AXES), "xnorm")
        pair = _choice(here, "sc_blk", views.scaling_pairs(shared_view), "W_Q,W_Q")
        seeds = _int(here, "sc_seeds", 1, views.SCALING_SEEDS_MAX, 3)
        layer = 0
        if shared_view.cfg.is_stack and axis != "layers":
            layer = _int(here, "sc_layer", 0, shared_view.cfg.n_layers - 1, 0)
        return {"sc_axis": axis, "sc_blk": pair, "sc_seeds": seeds, "sc_layer": layer}

    def bake(self, s: Settled) -> list[Baked]:
        out = []
        if s.open("norm"):
            out.append(_placement(s.shared["norm"]))
        if s.open("sc_blk"):
            blocks = _first(s.values["sc_blk"], self.BLOCKS, 3)
            texts = tuple(b.replace(",", "–") for b in blocks)
            out.append(Baked("sc_blk", "Block (rows,cols)", blocks, texts))
        if s.open("sc_axis") and s.values["sc_axis"] in ("xnorm", "L"):
            axes = _first(s.values["sc_axis"], ("xnorm", "L"), 2)
            out.append(Baked("sc_axis", "Sweep over", axes, tuple(sweeps.AXES[a] for a in axes)))
        return out

    @staticmethod
    def _offered(view: View, values: dict[str, object]) -> None:
        if values["sc_blk"] not in views.scaling_pairs(view):
            raise LessonError(f"the block {values['sc_blk']} is not in a {view.cfg.norm} block")

    def draw(self, view: View, values: dict[str, object]) -> Drawn:
        self._offered(view, values)
        r = views.scaling(view, values["sc_axis"], values["sc_blk"], values["sc_seeds"], values["sc_layer"])
        lines = [f"Fit regime: {views.FIT_REGIME[values['sc_axis']]}"]
        outer = r.fits.get("outer")
        if outer is not None and np.isfinite(outer.slope):
            theory = "" if outer.expected is None else f" against the theory's {outer.expected:g}"
            lines.append(f"Outer: fitted slope {outer.slope:.2f}{theory}.")
        line = views.slopes_line(r)
        if line:
            lines.append(line)
        return Drawn([("sweep", r.figure), ("side_by_side", r.side_figure)], lines)

    def cost(self, view: View, values: dict[str, object]) -> Cost:
        self._offered(view, values)
        price = views.scaling_price(view, values["sc_axis"], values["sc_blk"], values["sc_seeds"])
        return budget.cost("sweep", price.pop("cfg"), **price)

    def points(self, view: View, values: dict[str, object]) -> list[tuple]:
        if values["sc_blk"] not in views.scaling_pairs(view):
            return []
        return views.scaling_points(
            view, values["sc_axis"], values["sc_blk"], values["sc_seeds"], values["sc_layer"]
        )

    def covers(self, s: Settled, baked: list[Baked]) -> str:
        axes = next((b.values for b in baked if b.key == "sc_axis"), (s.values["sc_axis"],))
        grids = {a: sweeps.DEFAULT_GRIDS[a] for a in axes}
        parts = [
            f"{sweeps.AXES[a]} from {min(g):g} to {max(g):g} ({len(g)} points, along each chart's x axis)"
            for a, g in grids.items()
        ]
        return "This lesson page covers " + " and ".join(parts) + _baked_words(baked) + "."

    def swept(self, s: Settled, baked: list[Baked]) -> set[str]:
        return set(next((b.values for b in baked if b.key == "sc_axis"), (s.values["sc_axis"],)))


class SpectrumLesson(LessonSpec):
    """The Spectrum page's dense view: baked are the placement and the loss."""

    page = "spectrum"

    def settle(self, here: Address, shared_view: View) -> dict[str, object]:
        method = _choice(here, "spec_method", ("auto", "dense", "matrix-free"), "auto")
        shown = here.page_value(
            "spec_terms",
            list(NAMES),
            lambda t: state.settle("spec_terms", t, list(NAMES), options=NAMES, multi=True),
        )
        P = shared_view.num_params
        if method == "matrix-free" or P > DENSE_LIMIT:
            raise LessonError(
                f"spec_method: the matrix-free spectrum (P = {P:,}) is not offered as a lesson "
                f"page; use the dense one (P ≤ {DENSE_LIMIT:,}: lower d, d_ff or L)."
            )
        return {"spec_method": method, "spec_terms": tuple(shown) or NAMES}

    def bake(self, s: Settled) -> list[Baked]:
        out = []
        if s.open("norm"):
            out.append(_placement(s.shared["norm"]))
        if s.open("loss"):
            losses = _first(s.shared["loss"], ("mse", "ce"), 2)
            out.append(Baked("loss", state.APP_SETTINGS["loss"].label, losses, losses))
        return out

    @staticmethod
    def _offered(view: View) -> None:
        if view.num_params > DENSE_LIMIT:
            raise LessonError(f"P = {view.num_params:,} is above the dense limit {DENSE_LIMIT:,}")

    def draw(self, view: View, values: dict[str, object]) -> Drawn:
        self._offered(view)
        r = views.spectrum(view, values["spec_terms"])
        return Drawn(
            [("sorted", r.sorted_figure), ("histogram", r.histogram), ("block_norms", r.bars)],
            [views.spectrum_line(r)],
        )

    def cost(self, view: View, values: dict[str, object]) -> Cost:
        self._offered(view)
        return budget.cost("spectrum", view.cfg, dense_limit=DENSE_LIMIT, k=views.SPECTRUM_K)

    def covers(self, s: Settled, baked: list[Baked]) -> str:
        return (
            "This lesson page covers every eigenvalue of the full, outer and functional terms"
            + _baked_words(baked)
            + "; click a term in a legend to hide it."
        )


class CollapseLesson(LessonSpec):
    """The LayerNorm collapse page: σ is each chart's x axis; baked is ε (LayerNorm alone, cheap)."""

    page = "layernorm_collapse"
    stacks = False

    def settle(self, here: Address, shared_view: View) -> dict[str, object]:
        if shared_view.cfg.d_model < 2:
            raise LessonError("d: LayerNorm needs d ≥ 2 (a single feature has no variance).")
        return {
            "lnc_view": _choice(here, "lnc_view", views.LN_VIEWS, "layernorm"),
            "lnc_decades": _int(here, "lnc_decades", 2, 7, 4),
            "lnc_seeds": _int(here, "lnc_seeds", 1, 5, 2),
        }

    def bake(self, s: Settled) -> list[Baked]:
        if s.open("eps") and s.values["lnc_view"] == "layernorm":
            return [
                Baked(
                    "eps",
                    state.APP_SETTINGS["eps"].label,
                    EPS_GRID,
                    tuple(f"{e:g}" for e in EPS_GRID),
                    slider=True,
                )
            ]
        return []

    def draw(self, view: View, values: dict[str, object]) -> Drawn:
        if values["lnc_view"] == "layernorm":
            r = views.layernorm_collapse(view, values["lnc_decades"], values["lnc_seeds"])
        else:  # the W_Q–W_Q block alone: the whole-matrix norms take minutes
            r = views.block_collapse(view, values["lnc_decades"], values["lnc_seeds"], whole=False)
        slopes = ", ".join(f"{k} {v}" for k, v in r.slopes.items())
        return Drawn([("collapse", r.figure)], [f"Slopes: {slopes}"])

    LN_POINT_S = 1e-3
    """Seconds per (σ, seed) point of LayerNorm alone on an 8 × 16 input (measured 0.25 ms with the
    figure's 0.1 s spread over 26 points), growing like L·d³ (a row's d × d² Hessian) past it."""

    def cost(self, view: View, values: dict[str, object]) -> Cost:
        points = (3 * values["lnc_decades"] + 1) * values["lnc_seeds"]
        if values["lnc_view"] != "layernorm":  # the page's own price of the W_Q–W_Q block alone
            return budget.cost("ln_collapse", view.with_values(norm="post").cfg, points=points, whole=0)
        L, d = view.cfg.seq_len, view.cfg.d_model
        each = self.LN_POINT_S * max(1.0, L * d**3 / (8 * 16**3))
        return Cost(points * each, 8 * 4 * L * d**3, f"LayerNorm alone ({points} points)")

    def covers(self, s: Settled, baked: list[Baked]) -> str:
        d = s.values["lnc_decades"]
        x = "σ" if s.values["lnc_view"] == "layernorm" else "σ_min"  # as the chart's x axis is titled
        text = f"This lesson page covers {x} from 1 down to 1e-{d} (along the chart's x axis)"
        text += _baked_words(baked)
        if s.values["lnc_view"] == "layernorm":
            text += "; the Post-LN block view (lnc_view=block) is a page of its own"
        return text + "."


def _baked_words(baked: list[Baked]) -> str:
    return "".join(
        f", {b.label} {', '.join(b.texts)}"
        if not b.slider
        else f", {b.label} from {b.texts[0]} to {b.texts[-1]}"
        for b in baked
    )


PAGES: dict[str, LessonSpec] = {p.page: p for p in (ScalingLesson(), SpectrumLesson(), CollapseLesson())}
"""URL path -> how that page becomes a lesson page."""


# ----------------------------------------------------------------------------- the URL


def split_url(url: str) -> tuple[str, address.Query]:
    """``/scaling?norm=pre`` or ``http://host:8501/scaling?norm=pre`` -> ``("scaling", {"norm": ["pre"]})``.

    >>> split_url("http://localhost:8501/scaling?norm=pre&hide=L")
    ('scaling', {'norm': ['pre'], 'hide': ['L']})
    """
    parts = urlsplit(url.strip())
    path = parts.path.strip("/").rsplit("/", 1)[-1] if parts.path.strip("/") else ""
    return path or next(p.url_path for p in registry.ALL_PAGES if p.default), address.parse_query(parts.query)


NAME_CHARS = 120
"""The longest file name :func:`file_name` gives (most file systems take 255 bytes)."""


def file_name(url: str) -> str:
    """The file name of the lesson page of ``url``: its page and every key and value of its query (the
    shared controls in the app's order, then the page's, then ``hide``), so that two downloads of
    different views never share a name, and two links to one view give one name. Only letters,
    digits, ``.`` and ``_`` are kept, anything else becomes ``-``; a name longer than
    :data:`NAME_CHARS` is cut and ends in a hash of every key and value (still one name per view).

    >>> file_name("/spectrum?norm=post&d=16")
    'hessviz-spectrum-d-16-norm-post.html'
    >>> file_name("http://localhost:8501/scaling?sc_blk=W_Q%2CW_K&hide=norm,sc_axis&present=1")
    'hessviz-scaling-sc_blk-W_Q-W_K-hide-norm-sc_axis.html'
    >>> file_name("/scaling?x=../../etc/passwd")
    'hessviz-scaling-x-..-..-etc-passwd.html'
    """
    page, query = split_url(url)
    order = list(state.APP_SETTINGS)
    keys = sorted(query, key=lambda k: (0, order.index(k), k) if k in order else (1 + (k == "hide"), 0, k))
    words = [page] + [w for k in keys if k != "present" for w in (k, *query[k])]
    stem = re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9._]", "-", "-".join(["hessviz", *words]))).strip("-.")
    if len(stem) + len(".html") > NAME_CHARS:
        digest = hashlib.sha256("\n".join(words).encode()).hexdigest()[:10]
        stem = stem[: NAME_CHARS - len(".html") - len(digest) - 1].rstrip("-.") + "-" + digest
    return stem + ".html"


def settle(url: str) -> tuple[LessonSpec, Settled]:
    """The page and values of the lesson URL, as the app settles them; :class:`LessonError` with the
    app's line for anything it does not offer."""
    page, query = split_url(url)
    known = {p.url_path: p for p in registry.ALL_PAGES}
    if page not in known:
        raise LessonError(
            f"the app has no page /{page}; its pages are " + ", ".join(f"/{p}" for p in known) + "."
        )
    if page not in PAGES:
        raise LessonError(
            f"the {known[page].title} page (/{page}) is not offered as a lesson page; "
            f"these are: {', '.join('/' + p for p in PAGES)}."
        )
    spec = PAGES[page]
    here = Address()
    here.arrive(query)
    reconciled, notes = state.reconcile(here.shared)
    here.shared.update(reconciled)
    here.notes += notes
    here.open(page)
    base = Settled(page, dict(here.shared), {}, here.lesson, query)
    _refuse(here.notes)
    try:
        shared_view = base.view(stacks=spec.stacks)
    except hv.HessvizError as err:
        raise LessonError(f"These controls do not describe a valid block. {err}") from None
    base.values = spec.settle(here, shared_view)
    _refuse(here.notes)
    return spec, base


def _refuse(notes: list[str]) -> None:
    if notes:
        raise LessonError(" ".join(dict.fromkeys(notes)))


# ----------------------------------------------------------------------------- the page


def compact(value: object) -> object:
    """JSON-ready ``value`` with every number at :data:`DIGITS` significant digits (NaN, ±∞ -> null)."""
    if isinstance(value, dict):
        if set(value) >= {"dtype", "bdata"}:  # plotly's typed array: base64 of the raw numbers
            raw = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
            shape = [int(n) for n in str(value.get("shape", raw.size)).split(",")]
            return compact(raw.reshape(shape))
        return {k: compact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [compact(v) for v in value]
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc" or value.dtype.kind in "iu":
            return compact(value.tolist())
        return [compact(v) for v in value.tolist()]
    if isinstance(value, (float, np.floating)):
        x = float(value)
        return float(f"{x:.{DIGITS}g}") if math.isfinite(x) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def figure_json(fig: go.Figure) -> dict:
    """The figure in the light theme as compact JSON (data, layout; the template apart)."""
    light = plots.apply_theme(go.Figure(fig), "light").to_plotly_json()
    layout = compact(light["layout"])
    layout.pop("width", None)
    layout["autosize"] = True
    return {"data": compact(light["data"]), "layout": layout}


Progress = Callable[[int, int, str], None]


def _combination(spec: LessonSpec, s: Settled, baked: list[Baked], combo: tuple) -> tuple[View, dict]:
    """The view and the page's values of one combination of the baked values."""
    shared = {b.key: b.values[i] for b, i in zip(baked, combo) if b.key in state.APP_SETTINGS}
    values = {**s.values, **{b.key: b.values[i] for b, i in zip(baked, combo) if b.key not in shared}}
    return s.view(shared, stacks=spec.stacks), values


def _prime(spec: LessonSpec, s: Settled, baked: list[Baked], combos: list[tuple], workers: int) -> None:
    """Compute every combination's sweep points ahead on ``workers`` processes."""
    import concurrent.futures as cf
    import multiprocessing

    from hessviz.app import cache

    calls = []
    for combo in combos:
        try:
            calls += spec.points(*_combination(spec, s, baked, combo))
        except hv.HessvizError:
            continue  # drawn (and refused) one by one below
    if len(calls) < 8 * workers:
        return
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        cache.prime_sweep_points(calls, pool)


def build(url: str, *, limit: int = LIMIT_BYTES, progress: Progress | None = None, workers: int = 1) -> str:
    """The lesson page of ``url`` as one HTML text (see the module docstring). ``workers`` > 1: the
    sweep points are computed ahead on that many processes."""
    from plotly.offline import get_plotlyjs

    spec, s = settle(url)
    baked = spec.bake(s)
    combos = list(itertools.product(*(range(len(b.values)) for b in baked)))
    plotly_js = get_plotlyjs()
    if workers > 1:
        if progress is not None:
            progress(0, len(combos), f"sweep points on {workers} processes")
        _prime(spec, s, baked, combos, workers)
    views_out: dict[str, object] = {}
    figures: dict[str, int] = {}
    """Each distinct figure's JSON -> its index in the page's list."""
    template = None
    first_size = 0
    for n, combo in enumerate(combos):
        if progress is not None:
            progress(n, len(combos), f"view {n + 1} of {len(combos)}")
        name = "|".join(map(str, combo))
        try:
            view, values = _combination(spec, s, baked, combo)
            drawn = spec.draw(view, values)
        except hv.HessvizError as err:
            if n == 0:
                raise LessonError(str(err)) from None
            views_out[name] = {"error": f"Not in this lesson page: {err}"}
            continue
        figs = []
        for _, fig in drawn.figures:  # a figure several views share (the side-by-side chart) is kept once
            j = figure_json(fig)
            t = j["layout"].pop("template", None)
            template = template or t
            text = json.dumps(j, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            figs.append(figures.setdefault(text, len(figures)))
        views_out[name] = {"describe": view.describe(), "figures": figs, "lines": drawn.lines}
        if n == 0:
            first_size = sum(len(t) for t in figures)
            estimate = len(plotly_js) + 40_000 + first_size * len(combos)
            if estimate > limit:
                worst = max(baked, key=lambda b: len(b.values))
                raise LessonError(
                    f"{worst.key}: this lesson page would be about {format_bytes(estimate)} "
                    f"({len(combos)} views of {format_bytes(first_size)}), over the "
                    f"{format_bytes(limit)} limit; fix {worst.key} (add it to hide=) to bake "
                    f"{len(worst.values)} times fewer views."
                )
    if progress is not None:
        progress(len(combos), len(combos), "writing the page")
    data = {
        "url": url,
        "controls": [
            {"key": b.key, "label": b.label, "texts": list(b.texts), "slider": b.slider} for b in baked
        ],
        "views": views_out,
        "figures": [json.loads(t) for t in figures],
        "template": template,
        "config": modebar.config(f"hessviz-{spec.page}"),
    }
    text = _page(spec, s, baked, data, plotly_js)
    if len(text.encode()) > limit:
        worst = max(baked, key=lambda b: len(b.values)) if baked else None
        raise LessonError(
            f"{worst.key if worst else 'the view'}: this lesson page is "
            f"{format_bytes(len(text.encode()))}, over the {format_bytes(limit)} limit"
            + (f"; fix {worst.key} (add it to hide=)." if worst else ".")
        )
    return text


def _fixed(s: Settled, baked: list[Baked], swept: set[str] = frozenset()) -> str:
    """The shared controls this page neither bakes nor sweeps along a chart's x axis (``swept``),
    with their values (the header's second line)."""
    keys = {b.key for b in baked} | set(swept)
    hidden = [k for k in state.APP_SETTINGS if k not in keys and s.lesson.hides(k)]
    return ", ".join(f"{k} = {state.APP_SETTINGS[k].format(s.shared[k])}" for k in hidden)


_SCRIPT_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def script_json(data: object) -> str:
    r"""``data`` as JSON to embed in an HTML ``<script>`` element: ``<``, ``>`` and ``&`` written as
    ``\u003c``, ``\u003e`` and ``\u0026`` (and the line separators U+2028, U+2029 escaped too).

    A lesson URL is the visitor's text and lands in the data (``url``, a refused view's line): a
    ``</script>`` there would end the element, and a ``<!--`` followed by ``<script`` puts the
    browser's parser in a state where the element's own ``</script>`` no longer ends it, which
    blanked the page. The characters occur only inside JSON strings, where the escapes mean the
    same characters: ``JSON.parse`` reads back exactly ``data``.

    >>> print(script_json({"url": "/a?x=<!--<script>&y=1"}))
    {"url":"/a?x=\u003c!--\u003cscript\u003e\u0026y=1"}
    """
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.translate(_SCRIPT_SAFE)


@functools.cache
def template_text(name: str) -> str:
    """The text of ``hessviz/app/templates/<name>``, shipped as package data (``MANIFEST.in``) and read
    through :mod:`importlib.resources`: ``lesson.html`` (a :meth:`str.format` text whose fields
    :func:`_page` fills), ``lesson.css`` and ``lesson.js`` (the page's style and its script, which
    shows the view of the chosen controls from the embedded ``lesson-data``)."""
    return resources.files("hessviz.app").joinpath("templates", name).read_text(encoding="utf-8")


def _page(spec: LessonSpec, s: Settled, baked: list[Baked], data: dict, plotly_js: str) -> str:
    p = registry.spec(spec.page)
    payload = script_json(data)
    controls = []
    for i, b in enumerate(baked):
        if b.slider:
            inner = (
                f'<input type="range" id="c{i}" name="{b.key}" min="0" max="{len(b.values) - 1}" '
                f'step="1" value="0" aria-label="{html.escape(b.label)}">'
                f'<output id="o{i}">{html.escape(b.texts[0])}</output>'
            )
        else:
            inner = "".join(
                f'<label><input type="radio" name="{b.key}" value="{j}"{" checked" if j == 0 else ""}>'
                f"<span>{html.escape(t)}</span></label>"
                for j, t in enumerate(b.texts)
            )
        legend = f"<legend>{html.escape(b.label)}</legend>"
        controls.append(f'<fieldset data-control="{i}">{legend}{inner}</fieldset>')
    fixed = _fixed(s, baked, spec.swept(s, baked))
    n_views = len(data["views"])
    return template_text("lesson.html").format(
        title=html.escape(f"{p.title}: a hessviz lesson"),
        heading=html.escape(p.title),
        summary=html.escape(p.summary[:1].upper() + p.summary[1:] + "."),
        covers=html.escape(spec.covers(s, baked)),
        fixed=html.escape(
            f"Fixed by this lesson: {fixed}."
            if fixed
            else "Every other control is fixed at the link's value."
        ),
        views=f"{n_views} view{'s' if n_views != 1 else ''}",
        controls="".join(controls),
        url=html.escape(s.page + ("?" + address.encode_query(s.query) if s.query else "")),
        plotly=plotly_js.replace("</script", "<\\/script"),
        payload=payload,
        css=template_text("lesson.css"),
        script=template_text("lesson.js"),
        toolbar=modebar.TOUCH_CSS.strip(),
    )


def write(
    url: str, out: str | Path, *, limit: int = LIMIT_BYTES, progress: Progress | None = None, workers: int = 1
) -> int:
    """Build the lesson page of ``url`` and write it to ``out`` whole or not at all (a temporary file in
    the same folder, renamed); returns its size in bytes."""
    text = build(url, limit=limit, progress=progress, workers=workers).encode()
    out = Path(out)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(text)
