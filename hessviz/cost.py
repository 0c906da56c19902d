r"""What one computation of hessviz costs, from the block's sizes alone (before anything is allocated).

Neutral estimates, one per computation of the library: core-seconds of work, peak bytes of the
results it holds and, for the matrix-free ones, the closed-form products it needs
(:class:`Cost`). Whether a server can afford them, and what a page of the app asks for, is the
app's business (:mod:`hessviz.app.budget`); nothing here knows a page.

The coefficients were measured on one core of the 2-vCPU development machine:

* a dense ``(P, P)`` float64 term costs ``8 P²`` bytes and ``TERM_S · P² · (1 + L d / 512) ·
  (1 + (H − 1)/5)`` s plus ``PAIR_S`` per block pair (:func:`term_cost`);
* a dense symmetric eigendecomposition ``≈ EIG_S · P³`` s (:func:`eig_cost`, with the branches of
  :func:`hessviz.spectra.eigenvalues`);
* the spectral norm of an ``m × n`` block (Gram matrix, then ``eigvalsh``)
  ``≈ NORM_S · min(m,n)² (m+n)`` s, or by Lanczos past a few hundred rows and columns
  ``≈ LANCZOS_NORM_S · m n`` s (:func:`norm_cost`, :func:`block_norms_cost`);
* the autograd reference ``≈ AUTOGRAD_S · P · L(d² + d·d_ff + L·d)`` s per term;
* a closed-form product of ``k`` columns ``MV_CALL_S + k (MV_COL_S + MV_S · work)``
  (:func:`matvec_cost`), on a real layer ``REAL_PRODUCT_S · L · P`` per column
  (:func:`real_window_cost`, :func:`real_table_cost`: calibrated on MiniLM);
* a sweep point at least ``POINT_S``; in a stack of ``N`` blocks the curvature carried down through
  the ``N − 1`` blocks above the first, one ``2 L d``-column product each, more
  (:func:`sweep_point_cost`).

>>> import hessviz as hv
>>> cfg = hv.BlockConfig(seq_len=8, d_model=16, d_k=8, d_ff=32)
>>> c = term_cost(cfg)
>>> c.bytes > 8 * cfg.num_params ** 2, c.products
(True, 0)
>>> eig_cost(5000, 4096, 5) < eig_cost(5000, 8192, 5)     # past the dense limit: Lanczos extremes
True
>>> matfree_spectrum_cost(cfg, k=5, probes=4, steps=30).products    # 2 × 80 Lanczos + 4 × 30 SLQ
280
"""

from __future__ import annotations

from dataclasses import dataclass

from hessviz.config import BlockConfig
from hessviz.matfree.estimates import block_list, lanczos_products, slq_group
from hessviz.matfree.operator import BATCH
from hessviz.matfree.spectral import EXACT_BLOCK

EIG_S = 5e-11  # dense eigvalsh of n × n: EIG_S · n³ seconds
EIGSH_S = 3e-9  # Lanczos extremes (k largest and k smallest, ~7k products with H): EIGSH_S · n² · 2k
RANGE_S = 1e-10  # all eigenvalues from the range of a rank-r matrix: RANGE_S · n² · (r + 10)
NORM_S = 5e-11  # spectral norm of m × n via its Gram matrix: NORM_S · min² (m + n)
LANCZOS_NORM_S = 1e-8  # … by Lanczos from min(m, n) ≥ LANCZOS_NORM_MIN: LANCZOS_NORM_S · m n (20-40
#                        products), 2.5× that for a non-symmetric block (products with M and Mᵀ, more steps)
TERM_S = 1.2e-9  # one closed-form dense term: TERM_S · P² · (1 + L d / 512) · (1 + (H − 1)/5)
PAIR_S = 4e-4  # fixed work per block pair of a dense term at L d = 256
AUTOGRAD_S = 3e-8  # autograd reference: AUTOGRAD_S · P · L (d² + d d_ff + L d) per term
POINT_S = 0.006  # fixed cost of one sweep point (weights, inputs, the block's forward and backward)
CASE_S = 0.03  # one random configuration of the bounds / LayerNorm studies
STEP_S = 2e-9  # one optimizer step: STEP_S · P · L · d (forward + closed-form gradient)

MV_CALL_S = 3e-4  # one matrix-free product call (res.matvec, hessviz.matfree): fixed cost
MV_COL_S = 3.5e-4  # … plus per column MV_COL_S + MV_S · L · P (calibration: benchmarks/COST.md)
MV_S = 2e-9
MV_BLOCK_COL_S = 2e-5
"""… per column instead of ``MV_COL_S`` for a product restricted to one diagonal block ``H[b, b]``
(:func:`block_table_cost`; calibration: ``benchmarks/COST.md``)."""
TABLE_LANCZOS_PRODUCTS = 20
"""Products a block's top eigenvalue takes in :func:`hessviz.matfree.block_table`, as it runs (13-15
measured on the paper's blocks; :func:`lanczos_products` is the bound that sizes memory)."""
REORTH_S = 1e-9  # SLQ full reorthogonalisation: REORTH_S · steps² · P per probe
REAL_PRODUCT_S = 2.1e-10
"""Seconds per product column per ``L · P`` on one core of a real layer, calibrated on MiniLM's layer 3.
The generic :func:`matvec_cost` is calibrated on the paper's blocks and over-estimates a real layer's
batched products (both calibrations: ``benchmarks/COST.md``)."""


@dataclass(frozen=True)
class Cost:
    """Estimated work of a computation: core-seconds, peak bytes held, closed-form products."""

    seconds: float
    bytes: int
    what: str
    """In words, e.g. ``"a dense term of P = 6,144"``."""
    products: int = 0
    """Closed-form Hessian-vector product columns (matrix-free computations; 0 for dense ones)."""

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.seconds + other.seconds, self.bytes + other.bytes, self.what, self.products + other.products
        )


# ----------------------------------------------------------------------------- dense terms


def term_cost(cfg: BlockConfig) -> Cost:
    """One dense closed-form term, ``(P, P)`` float64, plus its working memory.

    A real layer costs more per entry than the paper block of the same ``P``: each head pair
    has its own cross-head terms (``× (1 + (H − 1)/5)``), and every block pair its own fixed work
    (``PAIR_S · pairs · L d / 256``: biases and γ/β add many small blocks). Both factors as
    measured: ``benchmarks/COST.md``.
    """
    P, L, d, H = cfg.num_params, cfg.seq_len, cfg.d_model, cfg.n_heads
    working = 8 * L * (L + d) * (d + cfg.d_ff + H * cfg.d_k) + 8 * H * L * L * (L + d)
    n = len(cfg.param_names)
    seconds = TERM_S * P * P * (1 + L * d / 512) * (1 + (H - 1) / 5) + PAIR_S * n * (n + 1) / 2 * L * d / 256
    return Cost(seconds, 8 * P * P + working, f"a dense term of P = {P:,}")


def norm_cost(m: int, n: int, symmetric: bool = True) -> float:
    """Seconds for :func:`hessviz.spectra.matrix_norm` of an ``m × n`` matrix on the CPU (same
    branches): a dense eigendecomposition of the smaller Gram matrix, or Lanczos from
    :data:`hessviz.spectra.LANCZOS_NORM_MIN` on (calibration: ``benchmarks/COST.md``)."""
    from hessviz.spectra import LANCZOS_NORM_MIN

    if min(m, n) >= LANCZOS_NORM_MIN:
        return LANCZOS_NORM_S * m * n * (1.0 if symmetric and m == n else 2.5)
    return NORM_S * min(m, n) ** 2 * (m + n)


def block_norms_cost(cfg: BlockConfig) -> float:
    """Seconds for the spectral norm of every block pair of one term."""
    sizes = [cfg.param_size(n) for n in cfg.param_names]
    return sum(
        norm_cost(m, n, symmetric=j == 0) for i, m in enumerate(sizes) for j, n in enumerate(sizes[i:])
    )


def dense_eig_cost(n: int) -> float:
    """Seconds for every eigenvalue of a dense symmetric ``n × n`` matrix."""
    return EIG_S * n**3


def eig_cost(n: int, dense_limit: int, k: int, rank: int | None = None) -> float:
    """Seconds for :func:`hessviz.spectra.eigenvalues` with these arguments (same branches)."""
    if rank is not None and n > dense_limit and 2 * (rank + 10) <= n:
        return RANGE_S * n * n * (rank + 10)
    if n <= dense_limit or 2 * k >= n - 1:
        return dense_eig_cost(n)
    return EIGSH_S * n * n * 2 * k


def autograd_cost(cfg: BlockConfig) -> float:
    """Seconds for one term of the autograd reference (:mod:`hessviz.reference`)."""
    L, d = cfg.seq_len, cfg.d_model
    return AUTOGRAD_S * cfg.num_params * L * (d * d + d * cfg.d_ff + L * d + L * cfg.d_k)


def compare_cost(cfg: BlockConfig, repeats: int = 2) -> Cost:
    """:func:`hessviz.verify.compare`: both methods, three terms each, ``repeats`` timed runs, and
    the closed form's three terms once more in float32 (the rounding scale)."""
    from hessviz.api import hessian_bytes

    P = cfg.num_params
    need = hessian_bytes(cfg, cfg.param_names, 8, "autograd") + (3 + 3 * repeats) * 8 * P * P + 3 * 4 * P * P
    return Cost(
        repeats * 3 * (term_cost(cfg).seconds + autograd_cost(cfg)) + 3 * term_cost(cfg).seconds,
        need,
        f"the comparison with autograd (P = {P:,}, {P:,} Hessian-vector products)",
    )


# ----------------------------------------------------------------------------- sweeps and studies


def stack_work(cfg: BlockConfig) -> float:
    """``work`` of one block in a stack's curvature: its weights ``L·P`` and its attention maps
    ``4 H L² (d_k + d_v)`` per column."""
    L, H = cfg.seq_len, cfg.n_heads
    return L * cfg.num_params + 4 * H * L * L * (cfg.d_k + cfg.value_width)


def sweep_point_cost(cfg: BlockConfig, weight_count: int) -> float:
    """Seconds of :func:`hessviz.sweeps.point` for a pair of weights of up to ``weight_count`` entries each.

    In a stack of ``N`` blocks the curvature is carried down through the ``N − 1`` blocks above the
    first, ``(L d)``-column maps through each: ``(N − 1) · matvec_cost(cfg.block, 2 L d)``. The
    estimate against the measured seconds per point, depth by depth: ``benchmarks/COST.md``.
    """
    per = (
        POINT_S
        + TERM_S * weight_count * weight_count * (1 + cfg.seq_len * cfg.d_model / 512) * 3
        + 3 * norm_cost(weight_count, weight_count)
    )
    if cfg.is_stack:
        per += (cfg.n_layers - 1) * matvec_cost(cfg.block, columns=2 * cfg.seq_len * cfg.d_model)
    return per


def attention_case_cost(cfg: BlockConfig) -> Cost:
    """:func:`hessviz.experiments.bounds.case_row` on the attention-only block of ``cfg``'s sizes:
    two dense terms, three eigendecompositions (the whole term's norm through its Gram matrix)
    and two sets of block norms."""
    att = BlockConfig(seq_len=cfg.seq_len, d_model=cfg.d_model, d_k=cfg.d_k, norm="attention")
    ta = term_cost(att)
    Pa = att.num_params
    return Cost(
        2 * ta.seconds + 3 * dense_eig_cost(Pa) + 2 * block_norms_cost(att),
        3 * ta.bytes,
        f"the attention block of P = {Pa:,}",
    )


def ln_point_cost(cfg: BlockConfig, whole: bool = False) -> Cost:
    """One σ point of :func:`hessviz.experiments.ln_collapse.block_sweep`: the Post-LN block of
    ``cfg``'s sizes, its ``W_Q`` blocks of three terms and their norms; with ``whole`` also the
    three whole terms' norms (:func:`norm_cost`: Lanczos past a few hundred weights), of two computed
    terms, ``full`` being their sum."""
    post = BlockConfig(
        seq_len=cfg.seq_len, d_model=cfg.d_model, d_k=cfg.d_k, d_ff=cfg.d_ff, norm="post", ln_eps=cfg.ln_eps
    )
    q = post.param_size("W_Q")
    seconds, held = POINT_S + TERM_S * q * q * 3 + norm_cost(q, q), 8 * q * q * 3
    if whole:
        tp = term_cost(post)
        # two dense terms (``full`` is their sum: HessianResult.term) and three norms
        seconds += 2 * tp.seconds + 3 * norm_cost(post.num_params, post.num_params)
        held = 3 * tp.bytes + 2 * 8 * post.num_params**2
    return Cost(seconds, held, f"a Post-LN block of P = {post.num_params:,}")


def training_cost(cfg: BlockConfig, steps: int, runs: int = 1) -> Cost:
    """``runs`` training runs of ``steps`` steps of every optimizer of
    :func:`hessviz.experiments.optimizers.optimizer_study` (forward and closed-form gradient)."""
    P = cfg.num_params
    return Cost(
        STEP_S * P * cfg.seq_len * cfg.d_model * steps * runs * 3,
        16 * P * 8,
        f"{runs} training runs of {int(steps)} steps of P = {P:,}",
    )


def diagonal_blocks_cost(cfg: BlockConfig) -> Cost:
    """:func:`hessviz.experiments.heterogeneity.block_heterogeneity`: each weight's diagonal
    Hessian block of three terms and its norms."""
    sizes = [cfg.param_size(n) for n in cfg.param_names]
    per = sum(TERM_S * n * n * (1 + cfg.seq_len * cfg.d_model / 512) * 3 + norm_cost(n, n) for n in sizes)
    return Cost(per, 8 * 3 * max(sizes) ** 2, f"diagonal Hessian blocks of up to {max(sizes):,} weights")


# ----------------------------------------------------------------------------- matrix-free


def matvec_cost(cfg: BlockConfig, columns: int = 1, calls: int = 1, column_s: float = MV_COL_S) -> float:
    """Seconds for ``calls`` matrix-free products of ``columns`` columns each (closed form): per
    column ``column_s`` and the weights' work ``L·P`` plus each head's attention maps
    ``4 H L² (d_k + d_v)``."""
    return calls * (MV_CALL_S + columns * (column_s + MV_S * stack_work(cfg)))


def matvec_bytes(cfg: BlockConfig, columns: int = 1) -> int:
    """Working memory of one product: the tape (activations, ``H`` attention maps) and the
    columns in and out, O(P + L²·H + L·d_ff) per column."""
    return 4 * _tape_column(cfg) + columns * (3 * 8 * cfg.num_params + 2 * _tape_column(cfg))


def _tape_column(cfg: BlockConfig) -> int:
    """Bytes of the tape per column: ``L (4d + d_ff + 3 H d_k) + 3 H L²`` float64 numbers."""
    L, d, H = cfg.seq_len, cfg.d_model, cfg.n_heads
    return 8 * (L * (4 * d + cfg.d_ff + 3 * H * max(cfg.d_k, cfg.value_width)) + 3 * H * L * L)


def matfree_spectrum_cost(
    cfg: BlockConfig, k: int = 5, probes: int = 4, steps: int = 30, group_bytes: int = 64 << 20
) -> Cost:
    """One term's matrix-free spectrum: top-``k`` and bottom-``k`` by Lanczos
    (:func:`hessviz.matfree.eigenpairs`) and an SLQ density of ``probes × steps`` products in groups
    that fit ``group_bytes`` (:func:`hessviz.matfree.estimates.grouped_density`)."""
    P = cfg.num_params
    group = slq_group(P, probes, steps, group_bytes)
    seconds = (
        matvec_cost(cfg, 1, 2 * lanczos_products(k))
        + matvec_cost(cfg, group, probes * steps / group)
        + REORTH_S * steps * steps * P * probes
    )
    held = matvec_bytes(cfg, group) + 8 * P * (group * min(steps, P) + max(2 * k + 1, 20) + 2)
    what = f"{2 * k} Lanczos eigenvalues and {probes} × {steps} SLQ products of P = {P:,}"
    return Cost(seconds, held, what, 2 * lanczos_products(k) + probes * steps)


def block_table_cost(cfg: BlockConfig, samples: int = 30, by_head: bool = True) -> Cost:
    """:func:`hessviz.matfree.block_table` of every block (:func:`block_list`): dense from ``|b|``
    products when ``|b| ≤`` :data:`EXACT_BLOCK`, else Lanczos and Hutch++ (``samples`` products)."""
    blocks = block_list(cfg, by_head)
    seconds, held, products = 0.0, matvec_bytes(cfg, 1), 0
    for _, n in blocks:
        if n <= EXACT_BLOCK:
            seconds += matvec_cost(cfg, n, column_s=MV_BLOCK_COL_S) + dense_eig_cost(n)
            held = max(held, matvec_bytes(cfg, n) + 16 * n * n)
            products += n
        else:
            seconds += matvec_cost(cfg, 1, TABLE_LANCZOS_PRODUCTS, column_s=MV_BLOCK_COL_S) + matvec_cost(
                cfg, samples // 3, 3, column_s=MV_BLOCK_COL_S
            )
            held = max(held, matvec_bytes(cfg, samples) + 8 * n * (samples + 22))
            products += lanczos_products(1) + samples
    return Cost(
        seconds,
        held,
        f"{len(blocks)} blocks of P = {cfg.num_params:,}, top eigenvalue and trace each",
        products,
    )


# ----------------------------------------------------------------------------- a real layer


def real_product_seconds(cfg: BlockConfig, columns: int) -> float:
    """Estimated seconds of ``columns`` closed-form product columns on a real layer
    (:data:`REAL_PRODUCT_S`)."""
    return REAL_PRODUCT_S * cfg.seq_len * cfg.num_params * columns


def window_bytes(cfg: BlockConfig, name: str, size: int) -> int:
    """Peak bytes of :func:`hessviz.pretrained.explore.window` for ``size`` entries of the slice
    ``name`` (``n`` entries): the block ``8 size²``, three ``(WINDOW_CHUNK, n)`` arrays of unit
    columns and products, and the tape of one sweep of ``BATCH`` columns, twice for the
    temporaries: 1.6× the 98 MiB measured for MiniLM's ``W_Q[0]`` at 23 tokens and 128 entries."""
    from hessviz.pretrained.explore import WINDOW_CHUNK

    n = cfg.param_size(cfg.sort_names((name,))[0])
    return 8 * size * size + 2 * (3 * 8 * WINDOW_CHUNK * n + 2 * BATCH * _tape_column(cfg))


def real_window_cost(cfg: BlockConfig, name: str, size: int) -> Cost:
    """:func:`hessviz.pretrained.explore.slice_window` for ``size`` entries of ``name``: ``size`` columns."""
    return Cost(
        real_product_seconds(cfg, size),
        window_bytes(cfg, name, size),
        f"the exact Hessian block of {size:,} entries ({size:,} products)",
        size,
    )


def real_table_cost(cfg: BlockConfig, blocks: list[tuple[str, int]], samples: int) -> Cost:
    """:func:`hessviz.pretrained.explore.curvature_table` for ``blocks`` (``(name, size)``): per
    block ≤ ``EXACT_BLOCK`` entries its size in columns, per larger block Lanczos
    (:func:`lanczos_products` single products) and ``samples`` Hutch++ columns.
    Memory: the layer's result (about 8 vectors of ``P``) and 24 vectors of the largest block (the
    Lanczos basis, Hutch++'s sketch), 8 bytes each: MiniLM's layer at 23 tokens peaked 140 MiB above
    its inputs for the attention weights (estimate 142 MB) and 150 MiB for the FFN (227 MB)."""
    columns = sum(n if n <= EXACT_BLOCK else lanczos_products(1) + samples for _, n in blocks)
    largest = max((n for _, n in blocks), default=0)
    return Cost(
        real_product_seconds(cfg, columns),
        8 * (8 * cfg.num_params + 24 * largest),
        f"the table of {len(blocks)} blocks ({columns:,} products)",
        columns,
    )
