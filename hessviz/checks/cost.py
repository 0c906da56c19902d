r"""What one computation of hessviz costs, from the block's sizes alone (before anything is allocated).

Neutral estimates, one per computation of the library: core-seconds of work, peak bytes of the
results it holds and, for the matrix-free ones, the closed-form products it needs
(:class:`Cost`). Whether a server can afford them, and what a page of the app asks for, is the
app's business (:mod:`hessviz.app.budget`); nothing here knows a page.

The coefficients were measured on one core of the 2-vCPU development machine:

* a dense ``(P, P)`` float64 term costs ``8 P²`` bytes and ``TERM_S · P² · (1 + L d / 512) ·
  (1 + (H − 1)/5)`` s plus ``PAIR_S`` per block pair (:func:`term_cost`);
* a dense symmetric eigendecomposition ``≈ EIG_S · P³`` s (:func:`eig_cost`, with the branches of
  :func:`hessviz.matfree.spectra.eigenvalues`);
* the spectral norm of an ``m × n`` block (Gram matrix, then ``eigvalsh``)
  ``≈ NORM_S · min(m,n)² (m+n)`` s, or by Lanczos past a few hundred rows and columns
  ``≈ LANCZOS_NORM_S · m n`` s (:func:`norm_cost`, :func:`block_norms_cost`);
* the autograd reference ``≈ AUTOGRAD_S · P · L(d² + d·d_ff + L·d)`` s per term;
* a closed-form product of ``k`` columns ``MV_CALL_S + k (MV_COL_S + MV_S · work)``
  (:func:`matvec_cost`), on a real layer ``REAL_PRODUCT_S · L · P`` per column
  (:func:`real_window_cost`, :func:`real_table_cost`: calibrated on MiniLM);
* the whole run of a command, in bytes, the forward tape first: ``TAPE_SQUARES · H L²`` numbers per
  layer before any term or product (:func:`tape_bytes`, :func:`dense_terms_bytes`,
  :func:`spectrum_report_bytes`, :func:`comparison_bytes`; what ``hessviz compute`` checks first);
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

from hessviz.block.config import BlockConfig
from hessviz.matfree.estimates import block_list, lanczos_products, slq_group
from hessviz.matfree.spectral import EXACT_BLOCK
from hessviz.products.operator import BATCH

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
REAL_PRODUCT_S = 1.2e-10
"""Seconds per product column per ``L · P`` on one core of a real layer: 2.1e-10 on MiniLM's layer 3
(``benchmarks/COST.md``), 0.6-1.5e-10 on SmolLM2-135M's last layer, less on longer texts
(``benchmarks/REAL_LLM.md``); the value between keeps both within 2×. The generic :func:`matvec_cost` is
calibrated on the paper's blocks and over-estimates a real layer's batched products."""
REAL_LANCZOS_PRODUCTS = 10
"""Products a real layer's block takes for its top eigenvalue in
:func:`hessviz.pretrained.explore.curvature_table`, as it runs (SmolLM2: 134 products for 9 blocks
with 6 Hutch++ samples each)."""
GRADIENT_S = 0.04
"""Seconds of a real layer's closed-form gradient besides its one product column (its forward pass and
the block norms; SmolLM2's last layer: 0.04-0.05 s)."""


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
    """Seconds for :func:`hessviz.matfree.spectra.matrix_norm` of an ``m × n`` matrix on the CPU (same
    branches): a dense eigendecomposition of the smaller Gram matrix, or Lanczos from
    :data:`hessviz.matfree.spectra.LANCZOS_NORM_MIN` on (calibration: ``benchmarks/COST.md``)."""
    from hessviz.matfree.spectra import LANCZOS_NORM_MIN

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
    """Seconds for :func:`hessviz.matfree.spectra.eigenvalues` with these arguments (same branches)."""
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
    """:func:`hessviz.checks.verify.compare`: both methods, three terms each, ``repeats`` timed runs, and
    the closed form's three terms once more in float32 (the rounding scale), one at a time."""
    from hessviz.api import hessian_bytes

    P = cfg.num_params
    need = hessian_bytes(cfg, cfg.param_names, 8, "autograd") + (3 + 3 * repeats) * 8 * P * P + 4 * P * P
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
    """Seconds of :func:`hessviz.laws.sweeps.point` for a pair of weights of up to ``weight_count`` entries
    each.

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
        per += (
            STACK_CARRY * (cfg.n_layers - 1) * matvec_cost(cfg.block, columns=2 * cfg.seq_len * cfg.d_model)
        )
    return per


STACK_CARRY = 0.2
"""The share of :func:`matvec_cost`'s ``2 L d`` columns that carrying a stack's curvature down one block
costs as :func:`hessviz.laws.sweeps.point` runs it (the columns go through in one batched map): 0.02 s per
block above the first at the app's default block against 0.1 s estimated before, which refused the
hosted Scaling page's layers axis and Depth's three layers at their default sizes (issue 44).
Measured by ``benchmarks/real_llm_estimates.py --stack`` (``benchmarks/REAL_LLM.md``)."""


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
    return 4 * _tape_column(cfg) + product_bytes(cfg, columns)


def product_bytes(cfg: BlockConfig, columns: int = 1) -> int:
    """Bytes of one product of ``columns`` columns beyond the tape it sweeps: the columns in and out
    and a work vector (``3 P``) and the tangents of every node (``2 ×`` :func:`_tape_column`) per
    column, float64."""
    return columns * (3 * 8 * cfg.num_params + 2 * _tape_column(cfg))


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


def real_window_cost(cfg: BlockConfig, name: str, size: int, vocab: int = 0) -> Cost:
    """:func:`hessviz.pretrained.explore.slice_window` for ``size`` entries of ``name``: ``size`` columns,
    and with ``vocab`` (a model's own next-token loss through its LM head) the head's work
    (:func:`head_cost`)."""
    head = head_cost(cfg, vocab, size)
    return Cost(
        real_product_seconds(cfg, size) + head.seconds,
        window_bytes(cfg, name, size) + head.bytes,
        f"the exact Hessian block of {size:,} entries ({size:,} products{head.what})",
        size,
    )


def real_table_cost(cfg: BlockConfig, blocks: list[tuple[str, int]], samples: int, vocab: int = 0) -> Cost:
    """:func:`hessviz.pretrained.explore.curvature_table` for ``blocks`` (``(name, size)``): per
    block ≤ ``EXACT_BLOCK`` entries its size in columns, per larger block Lanczos
    (:data:`REAL_LANCZOS_PRODUCTS` single products, as it runs) and ``samples`` Hutch++ columns; with
    ``vocab``, the LM head's work (:func:`head_cost`).
    Memory: the layer's result (about 8 vectors of ``P``) and 24 vectors of the largest block (the
    Lanczos basis, Hutch++'s sketch), 8 bytes each: MiniLM's layer at 23 tokens peaked 140 MiB above
    its inputs for the attention weights (estimate 142 MB) and 150 MiB for the FFN (227 MB)."""
    columns = sum(n if n <= EXACT_BLOCK else REAL_LANCZOS_PRODUCTS + samples for _, n in blocks)
    largest = max((n for _, n in blocks), default=0)
    head = head_cost(cfg, vocab, columns, table_calls(blocks, samples))
    return Cost(
        real_product_seconds(cfg, columns) + head.seconds,
        8 * (8 * cfg.num_params + 24 * largest) + head.bytes,
        f"the table of {len(blocks)} blocks (about {columns:,} products{head.what})",
        columns,
    )


def real_gradient_cost(cfg: BlockConfig, vocab: int = 0) -> Cost:
    """:func:`hessviz.pretrained.explore.gradient_blocks`: one closed-form gradient of the layer
    (about one product column) and, with ``vocab``, the head's value and gradient (no curvature)."""
    head = head_cost(cfg, vocab, 0)
    return Cost(
        GRADIENT_S + real_product_seconds(cfg, 1) + head.seconds,
        8 * 4 * cfg.num_params + head.bytes,
        f"the gradient of the layer{head.what}",
    )


SETUP_S = 1.5e-8
"""Seconds per weight of a real model's layers to read them (float64) and run a text through them
(SmolLM2-135M's 106 M layer weights: 1.4 s; :func:`real_setup_seconds`)."""


def real_setup_seconds(weights: int) -> float:
    """Reading ``weights`` layer weights and running a text through them, the first time a model and a
    text are drawn (all layers kept, or read one at a time and dropped: the same work)."""
    return SETUP_S * weights


HEAD_S = 2.6e-11
"""Seconds per multiply-add of a next-token head's products on one core (SmolLM2-135M,
``benchmarks/real_llm_estimates.py``, ``benchmarks/REAL_LLM.md``)."""
HEAD_CALL_S = 1.4e-9
"""… and per entry of the head ``(V, d)`` for each product call, whatever its columns: a call reads the
head twice (the logits, then back through it), 0.04 s for SmolLM2's 28 M entries in float64, so a
Lanczos run's single products cost 3-4× the flops' time per column."""
HEAD_BLOCKS_S = 3.9e-11
"""… of building its token-wise ``(L, d, d)`` blocks (an einsum: 13.3 s for SmolLM2 at 21 tokens)."""
HEAD_FIXED_S = 0.1
"""Seconds of placing the head at the last hidden states besides its value and gradient (SmolLM2)."""


def product_calls(columns: int) -> int:
    """Product calls for ``columns`` columns taken :data:`BATCH` at a time (a window's)."""
    return -(-columns // BATCH)


def table_calls(blocks: list[tuple[str, int]], samples: int) -> int:
    """Product calls of a real layer's curvature table: an exact block's columns :data:`BATCH` at a time,
    a large block's Lanczos one at a time and its Hutch++ samples :data:`BATCH` at a time."""
    return sum(
        product_calls(n) if n <= EXACT_BLOCK else REAL_LANCZOS_PRODUCTS + product_calls(samples)
        for _, n in blocks
    )


def _head_seconds(cfg: BlockConfig, vocab: int, columns: int, calls: int) -> tuple[float, float]:
    """``(as products, as blocks)``: seconds of a head's curvature for ``columns`` columns in ``calls``."""
    L, d = cfg.seq_len, cfg.d_model
    products = HEAD_CALL_S * vocab * d * calls + HEAD_S * 2 * L * vocab * d * columns
    return products, HEAD_BLOCKS_S * L * vocab * d * d


def head_blocks(cfg: BlockConfig, vocab: int, columns: int, calls: int) -> bool:
    """Does a computation of ``columns`` product columns in ``calls`` calls under a next-token head take
    the head's token-wise curvature as ``(L, d, d)`` blocks (built once: ``HEAD_BLOCKS_S · L V d²``)
    rather than its product (``HEAD_CALL_S · V d`` per call and ``HEAD_S · 2 L V d`` per column)?
    Whichever is estimated cheaper; no columns (a gradient) build no blocks."""
    if not columns:
        return False
    products, blocks = _head_seconds(cfg, vocab, columns, calls)
    return blocks < products


def head_cost(cfg: BlockConfig, vocab: int, columns: int, calls: int | None = None) -> Cost:
    """The LM head's share of a real layer's computation under the model's own next-token loss
    (:class:`hessviz.losses.NextToken` with a vocabulary of ``vocab``; 0: no head, no cost): the
    value and gradient (``2 L V d``), then the curvature of ``columns`` columns in ``calls`` calls
    (default :func:`product_calls`), as blocks or as products (:func:`head_blocks`). The SmolLM2 view
    the issue timed (49,152 tokens × a 400-character text) spent minutes here while the estimate left
    it out. Bytes: the token-wise blocks, or the logits of a chunk of positions for a product of
    :data:`BATCH` columns (at most :data:`HEAD_CHUNK_BYTES`); the head ``(V, d)`` itself is held once
    per model, not per view."""
    if not vocab:
        return Cost(0.0, 0, "")
    L, d = cfg.seq_len, cfg.d_model
    calls = product_calls(columns) if calls is None else calls
    blocks = head_blocks(cfg, vocab, columns, calls)
    curvature = min(_head_seconds(cfg, vocab, columns, calls)) if columns else 0.0
    return Cost(
        HEAD_FIXED_S + HEAD_S * 2 * L * vocab * d + curvature,
        8 * L * d * d if blocks else min(HEAD_CHUNK_BYTES, 8 * L * vocab * (2 * BATCH + 3)),
        f" and the LM head of {vocab:,} tokens",
    )


HEAD_CHUNK_BYTES = 64 << 20
"""The most bytes one chunk of a next-token head's logits takes (:func:`head_cost`; the head sizes its
chunks to a share of the memory guard's limit, :func:`hessviz.losses.next_token.default_chunk`)."""


# ----------------------------------------------------------------------------- whole runs, the tape first

TAPE_SQUARES = 7
"""``(L, L)`` arrays per head and layer that the tape of :func:`tape_bytes` holds at its peak."""
FORWARD_SQUARES = 3
"""… and that one plain forward pass holds (:func:`forward_bytes`)."""


def _token_numbers(cfg: BlockConfig) -> int:
    """Numbers per token of one layer's activations: the residual stream and LayerNorm values
    (``8 d``), the FFN's pre- and post-activation twice (``4 d_ff``, twice that gated) and each
    head's queries, keys, values and outputs (``4 H (d_k + d_v)``)."""
    ffn = cfg.d_ff * (2 if cfg.mlp == "gated" else 1)
    return 8 * cfg.d_model + 4 * ffn + 4 * cfg.n_heads * (cfg.d_k + cfg.value_width)


def forward_bytes(cfg: BlockConfig, itemsize: int = 8) -> int:
    """Peak bytes of one plain forward pass of one layer (``hv.forward``; a model's hidden states,
    one layer after the other): per head the scores, the weights and one ``(L, L)`` array in flight,
    and the activations per token. Measured: 2.1 ``H L²`` numbers above the activations (``L = 3000,
    H = 1`` and ``L = 2000, H = 4``), against :data:`FORWARD_SQUARES` here."""
    L = cfg.seq_len
    return itemsize * (FORWARD_SQUARES * cfg.n_heads * L * L + L * _token_numbers(cfg))


def tape_bytes(cfg: BlockConfig, itemsize: int = 8) -> int:
    """Peak bytes of the forward tape that ``hv.hessian`` builds before any term or product is
    asked for (:class:`hessviz.products.tape.Tape`: one forward pass keeping every value, and the
    first-order sweep): per head and layer the attention weights ``A`` and, after the sweep,
    ``Ā``, ``S̄``, ``Ā − r``, ``c S̄`` and ``c S̄ᵀ``, six ``(L, L)`` arrays, and one in flight
    (:data:`TAPE_SQUARES`); and the activations per token. Measured 6.1-6.4 ``H L²`` numbers at
    ``L = 2000-3000`` (default block, ``H = 1`` and ``4``). At ``L = 12,000`` tokens of one head this
    is 7.5 GiB, before any term: ``L²`` is what makes a long input expensive, not ``P``.

    >>> cfg = BlockConfig(seq_len=12_000)
    >>> round(tape_bytes(cfg) / 2**30, 1), round(tape_bytes(cfg, 4) / 2**30, 1)
    (7.5, 3.8)
    """
    L = cfg.seq_len
    return itemsize * cfg.n_layers * (TAPE_SQUARES * cfg.n_heads * L * L + L * _token_numbers(cfg))


def _size(cfg: BlockConfig, names: tuple[str, ...] | None) -> int:
    return cfg.num_params if names is None else sum(cfg.param_size(n) for n in names)


def dense_terms_bytes(
    cfg: BlockConfig, names: tuple[str, ...] | None = None, terms: int = 3, itemsize: int = 8
) -> int:
    """Peak bytes of ``hv.hessian(…, wrt=names)`` with ``terms`` dense ``(P', P')`` terms read and
    kept, and every eigenvalue of each: the tape (:func:`tape_bytes`), then the larger of the last
    term computed beside the ``terms − 1`` kept (:func:`hessviz.api.hessian_bytes`, the library's own
    guard on one term) and the ``terms`` kept with an eigendecomposition's float64 copy and work
    (``2 P'²``)."""
    from hessviz.api import hessian_bytes

    names = cfg.param_names if names is None else names
    P = _size(cfg, names)
    kept = P * P * itemsize
    one = hessian_bytes(cfg, names, itemsize, "closed_form")
    return tape_bytes(cfg, itemsize) + max(one + (terms - 1) * kept, terms * kept + 16 * P * P)


AUTOGRAD_PEAK = 1.3
"""What :func:`hessviz.checks.verify.compare` holds at its peak over the count of :func:`comparison_bytes`
without it: measured 10.2 GiB and 8.9 GiB beyond start-up (``hessviz verify -L 300``, and the
``pydoc-llama`` example of ``docs/cli.md``, ``P' = 8192``) where that count gives 8.9 and 7.6 GiB."""


def comparison_bytes(cfg: BlockConfig, names: tuple[str, ...] | None = None, itemsize: int = 8) -> int:
    """Peak bytes of :func:`hessviz.checks.verify.compare` (one timed run each): the tape, both methods'
    three terms with autograd's working memory (:func:`hessviz.api.hessian_bytes`, its vmapped
    tangents ``P' L (L + 3d + 2 d_ff + H d_k)`` numbers, times :data:`AUTOGRAD_PEAK`) and then,
    beside the six terms, the two Jacobians ``(L d, P')`` of twice that each (``hv.jacobian``'s own
    guard)."""
    from hessviz.api import hessian_bytes

    names = cfg.param_names if names is None else names
    P, Ld = _size(cfg, names), cfg.seq_len * cfg.d_model
    autograd = AUTOGRAD_PEAK * hessian_bytes(cfg, names, itemsize, "autograd")
    terms = int(autograd) + 6 * P * P * itemsize
    return tape_bytes(cfg, itemsize) + max(terms, 6 * P * P * itemsize + 4 * Ld * P * itemsize)


def spectrum_report_bytes(
    cfg: BlockConfig,
    names: tuple[str, ...] | None = None,
    *,
    top: int = 5,
    bottom: int = 0,
    density: bool = False,
    probes: int = 10,
    steps: int = 80,
    trace: int = 0,
    blocks: bool = False,
    itemsize: int = 8,
) -> int:
    """Peak bytes of ``hv.hessian`` and :func:`hessviz.matfree.report.spectrum_report` with these
    arguments: the tape, and the largest of its stages, each a product (:func:`product_bytes`) and
    the vectors it keeps: Lanczos ``max(2k+1, 20) + 2`` vectors of ``P'`` for ``top`` and ``bottom``,
    SLQ a basis of ``steps`` vectors per probe in a group (:func:`slq_group`), Hutch++ its sketch
    and probes (``P'`` unit vectors when ``trace ≥ P'``), the block table
    :func:`block_table_cost`'s bytes (which count a tape of their own: an over-estimate)."""
    P = _size(cfg, names)
    scale = itemsize / 8
    stages = [product_bytes(cfg, 1) + 8 * P * (max(2 * k + 1, 20) + 2) for k in (top, bottom) if k]
    if density:
        group = slq_group(P, probes, steps)
        stages.append(product_bytes(cfg, group) + 8 * P * group * (min(steps, P) + 2))
    if trace:
        columns = min(trace, BATCH)
        stages.append(product_bytes(cfg, columns) + (16 * P * P if trace >= P else 8 * P * 3 * trace))
    if blocks:
        stages.append(block_table_cost(cfg).bytes)
    return tape_bytes(cfg, itemsize) + int(scale * max(stages, default=0))


def hidden_states_bytes(cfg: BlockConfig, vocab: int, itemsize: int = 8) -> int:
    """Peak bytes of the hidden state entering a layer of a real model
    (:func:`hessviz.pretrained.layer_for_text`): the token embedding table ``(V, d)``, one layer's
    weights and one plain forward pass (:func:`forward_bytes`), one layer after the other."""
    return itemsize * (vocab * cfg.d_model + cfg.num_params) + forward_bytes(cfg, itemsize)


def next_token_bytes(cfg: BlockConfig, vocab: int, itemsize: int = 8) -> int:
    """Bytes of the next-token objective at ``Z`` (:class:`hessviz.losses.NextToken`): the LM head
    ``(V, d)`` and, up to :data:`~hessviz.losses.next_token.TOKEN_WISE_MAX_D` features, the
    token-wise curvature ``(L, d, d)``; its logits go in chunks sized to the memory limit."""
    from hessviz.losses.next_token import TOKEN_WISE_MAX_D

    d = cfg.d_model
    curvature = cfg.seq_len * d * d if d <= TOKEN_WISE_MAX_D else 0
    return itemsize * (vocab * d + curvature)
