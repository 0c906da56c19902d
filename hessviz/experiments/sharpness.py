r"""Wang et al.'s block sharpness on a real LLM, under their estimator and under hessviz's exact products.

Wang, Wang, Zhou, Yan, E and Wu (ICML 2025, arXiv:2502.19002) state the sharpness disparity
``S(Emb) ≪ S(QK) < S(FFN) < S(VO) ≪ S(Norm)`` with the **average sharpness** of a block type
``T``, the trace of its diagonal Hessian block over its size, ``S(T) = tr(H_{TT}) / m_T``, the
Hessian replaced by the Gauss–Newton matrix ``G = Jᵀ (\mathrm{diag}\,p − p pᵀ) J`` (``J`` the
Jacobian of the logits) and its diagonal estimated by the Gauss–Newton–Bartlett (GNB) estimator
of Sophia (Liu et al., 2024): draw each position's label ``ŷ_t ~ p_t`` from the model's own
predictive distribution, take the gradient ``ĝ`` of the mean cross-entropy against the drawn
labels over the ``N`` predicted tokens of the batch, and

.. math::
    \widehat{\mathrm{diag}\, G} = N\, ĝ ⊙ ĝ, \qquad
    \mathbb E_{ŷ}\big[N ĝ ⊙ ĝ\big] = \frac1N \sum_t \mathrm{diag}\,G_t = \mathrm{diag}\,G

(``E[∇ℓ_t] = J_tᵀ E[p_t − e_{ŷ_t}] = 0``, so the cross terms between positions vanish in
expectation), hence ``Ŝ_GNB(T) = N ‖ĝ_T‖² / m_T``. (The paper's text was not at hand here: this is
the estimator as its Sophia citation defines it, the assumption said in every report.) A type is the
union of its tensors over every layer: QK = ``W_Q, W_K``; VO = ``W_V, W_O``; FFN = ``W_G, W_1,
W_2``; Norm = every normalisation weight inside the layers (``*_gamma``: the two or four norms of
a layer and a QK-norm's); Emb = the tied embedding matrix ``E (V, d)`` with **both** its copies:
the unembedding of the head and the input lookup ``X0_t = s · E[id_t]`` (``s = √d`` for Gemma, 1
for SmolLM2), ``∂ℓ/∂E = \sum_t r_t h_tᵀ + s \sum_t e_{id_t} (∂ℓ/∂X0_t)ᵀ``, the second from the
first-order adjoint at the stack's input, exact in closed form.

Beside it, its exact counterpart from hessviz's closed-form products of the **true** loss (labels
the text's next tokens): ``tr(H_{TT}) / m_T`` for the ``outer`` term (``Jᵀ ∇²_Z ℓ J``, split at the
last layer's output ``Z``: the Gauss–Newton matrix of the stack, with the final norm's curvature
inside ``∇²_Z ℓ``) and the ``full`` Hessian, by Hutchinson on the whole-model operator: a block
product ``H_{TT} u_T`` per Rademacher probe ``u_T`` of each type gives ``u_Tᵀ H_{TT} u_T``, whose
mean is ``tr(H_{TT})`` (:func:`type_quadratic_forms`). The products are exact;
the trace is an estimate with its standard error. Emb there is the unembedding copy alone, in closed
form: logits are linear in ``E`` so ``H_out = G_out = \sum_t w_t (\mathrm{diag}\,p_t − p_t p_tᵀ) ⊗
h_t h_tᵀ`` and ``tr H_out = \sum_t w_t (1 − ‖p_t‖²) ‖h_t‖²`` (its top eigenvalue:
:func:`hessviz.experiments.smollm2.unembedding_top`); the input copy's second derivatives through
the stack are not among hessviz's products (no ``X`` in ``wrt``).

``python -m hessviz.experiments.sharpness --model smollm2-135m`` writes ``sharpness.json`` into the
model's stored folder (:func:`stored`); :mod:`hessviz.experiments.llm` reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import numpy as np
import torch
from torch import Tensor

from hessviz.experiments.llm_table import FOLDERS, SOURCES_OF_TEXT, stored  # noqa: F401  (read here and by llm)
from hessviz.losses.next_token import NextToken

TEXTS = (
    *SOURCES_OF_TEXT[:2],  # the openings SmolLM2's table reads (the Moby-Dick one is longer here)
    (
        "Herman Melville, Moby-Dick (1851), first sentences",
        "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my "
        "purse, and nothing particular to interest me on shore, I thought I would sail about a little.",
    ),
    (
        "Franz Kafka, Metamorphosis (1915), tr. David Wyllie, first sentence",
        "One morning, when Gregor Samsa woke from troubled dreams, he found himself transformed in his bed "
        "into a horrible vermin.",
    ),
)
"""The batch: one sequence per public-domain opening, each cut to the same number of tokens."""
SEQS, TOKENS = 4, 12
"""The stored runs' batch: 4 sequences × 12 tokens (modest: a 2-core machine shared by several)."""
ORDER = ("Emb", "QK", "FFN", "VO", "Norm")
WEIGHTS = {"QK": ("W_Q", "W_K"), "FFN": ("W_G", "W_1", "W_2"), "VO": ("W_V", "W_O")}


def block_type(name: str) -> str | None:
    """The type of a layer tensor ``l{i}.w`` (:data:`ORDER`), ``None`` for one outside them (biases).

    >>> [block_type(n) for n in ("l0.W_Q", "l3.W_2", "l1.q_norm_gamma", "l1.ln2_out_gamma", "l0.b_Q")]
    ['QK', 'FFN', 'Norm', 'Norm', None]
    """
    w = name.split(".", 1)[1]
    if w.endswith("_gamma"):
        return "Norm"
    return next((t for t, ws in WEIGHTS.items() if w in ws), None)


def types_of(names) -> dict[str, tuple[str, ...]]:
    """``{type: its tensors among names}`` in :data:`ORDER` (Emb apart), types without a tensor left out."""
    out: dict[str, list[str]] = {}
    for n in names:
        t = block_type(n)
        if t is not None:
            out.setdefault(t, []).append(n)
    return {t: tuple(out[t]) for t in ORDER if t in out}


def batch_ids(model: str, seqs: int = SEQS, tokens: int = TOKENS) -> Tensor:
    """``(seqs, tokens)``: the first ``tokens`` ids of each of the first ``seqs`` :data:`TEXTS` under
    ``model``'s own tokenizer (special tokens as it adds them)."""
    from hessviz.pretrained import token_ids

    if not 1 <= seqs <= len(TEXTS):
        raise ValueError(f"seqs must be in [1, {len(TEXTS)}], got {seqs}")
    rows = [token_ids(model, t)[:tokens] for _, t in TEXTS[:seqs]]
    short = [len(r) for r in rows if len(r) < tokens]
    if short or tokens < 2:
        raise ValueError(f"tokens = {tokens}: a text has only {min(short or [0])} tokens (at least 2 needed)")
    return torch.tensor(rows)


# ----------------------------------------------------------------------------- the paper's estimator
class SampledNextToken(NextToken):
    """The next-token cross-entropy against labels drawn from the model's own predictive distribution
    at each position (``ŷ_t ~ softmax(σ_t)``, the soft-capped logits where the head caps), seeded per
    ``(seed, sequence)``: the objective whose gradient the GNB estimator squares. ``labels``
    (``{sequence: (L − 1,) ids}``) fixes the draws instead (the tests enumerate them)."""

    def __init__(self, seed: int, chunk: int | None = None, labels: dict[int, Tensor] | None = None):
        super().__init__(chunk=chunk)
        self.seed, self.labels = seed, labels

    def sequence_terms(self, Z: Tensor, ids: Tensor, index: int, head) -> tuple:
        at = NextToken(Z, ids, head, self._chunk)
        s = at.h @ at.E.T
        at._cap(s)
        if self.labels is not None:
            y = torch.as_tensor(self.labels[index], dtype=torch.int64, device=Z.device)
        else:
            gen = torch.Generator().manual_seed(10_007 * self.seed + index)
            y = torch.multinomial(torch.softmax(s.double(), -1).cpu(), 1, generator=gen)[:, 0].to(Z.device)
        drawn = NextToken.__new__(NextToken)
        drawn._place(Z, at.positions, y, at.weight, head, self._chunk)
        self.drawn = getattr(self, "drawn", {}) | {index: drawn}
        return drawn.custom_loss(), drawn.value, None


def embedding_scale(model, ids: Tensor) -> float:
    """``s`` with ``X0_t = s · E[id_t]`` (the input copy of the tied matrix), read off the model's own
    embeddings; a :class:`ValueError` when the input rows are not a multiple of the head's rows (an
    untied or a position-embedded model)."""
    E = model.head.embedding.double()
    X0 = torch.cat([x.double() for x in model.embed(ids)])
    R = E[ids.reshape(-1)]
    s = float((X0 * R).sum() / (R * R).sum())
    if float((X0 - s * R).norm()) > 1e-3 * float(X0.norm()):
        raise ValueError(f"{model.name}: the input embeddings are not s·E[id] (untied or with positions)")
    return s


def gnb_draw(model, ids: Tensor, objective: SampledNextToken, s: float | None = None) -> dict[str, float]:
    """``{type: N ‖ĝ_T‖² / m_T}`` of one draw of labels (``objective``), ``Emb`` over both copies of the
    tied matrix, ``Emb_out`` over its unembedding copy alone (whose expectation is the closed form
    :func:`unembedding_trace` over ``V·d``: a check on the real model) (``s``: :func:`embedding_scale`,
    read when ``None``)."""
    import hessviz as hv

    names = tuple(n for n in model.names if block_type(n) is not None)
    s = embedding_scale(model, ids) if s is None else s
    B, L = ids.shape
    N = B * (L - 1)
    res = hv.model_hessian(model, ids, objective=objective, wrt=names)
    g = res.gradient(list(names))
    out = {}
    for t, ns in types_of(names).items():
        size = sum(g[n].numel() for n in ns)
        out[t] = N * float(sum(g[n].double().pow(2).sum() for n in ns)) / size
    gE = torch.zeros(model.head.embedding.shape, dtype=torch.float64)
    for b in range(B):  # each sequence's loss has weight 1/B in the mean
        drawn = objective.drawn[b]
        gE.addmm_(drawn_residual(drawn).T, drawn.h.double(), alpha=1.0 / B)  # the unembedding copy
    out["Emb_out"] = N * float(gE.pow(2).sum()) / gE.numel()
    for b in range(B):
        gX = res.parts[b].products.tape.adjoints["X"].double()  # ∂ℓ_b/∂X0_b: the input copy
        gE.index_add_(0, ids[b].to(gE.device), s * gX.cpu() / B)
    out["Emb"] = N * float(gE.pow(2).sum()) / gE.numel()
    return out


def gnb(model, ids: Tensor, draws: int, log=lambda s: None) -> dict[str, list[float]]:
    """``{type: [Ŝ_GNB of each of draws label draws]}`` (module docstring, :func:`gnb_draw`)."""
    s = embedding_scale(model, ids)
    out: dict[str, list[float]] = {}
    for k in range(draws):
        t0 = time.perf_counter()
        for t, v in gnb_draw(model, ids, SampledNextToken(k), s).items():
            out.setdefault(t, []).append(v)
        log(f"GNB draw {k}: {time.perf_counter() - t0:.0f} s; load {os.getloadavg()[0]:.1f}")
    return out


def drawn_residual(at: NextToken) -> Tensor:
    """``(n, V)``: ``∂ℓ/∂s`` of a placed :class:`NextToken` at its raw logits ``s = h Eᵀ``:
    ``w · a ⊙ (p − e_y)`` (``a = σ'`` of the cap, 1 without one)."""
    s = (at.h @ at.E.T).double()
    a = at._cap(s)
    r = torch.softmax(s, -1)
    r[torch.arange(r.shape[0]), at.targets] -= 1.0
    return at.weight * (r if a is None else r * a)


# ----------------------------------------------------------------------------- hessviz's exact products
def type_quadratic_forms(
    res, term: str, probes: dict[str, Tensor], columns: int = 4
) -> dict[str, np.ndarray]:
    """``{type: (k,)}``: ``u_Tᵀ H_{TT} u_T`` for each column ``u_T`` of ``probes[T] (m_T, k)``, ``m_T``
    the sizes of type ``T``'s tensors (:func:`types_of` of ``res.names``, in that order), from the
    block products ``H_{TT} u_T`` (rows and columns the type's tensors, through every layer above
    its lowest). With Rademacher probes each mean estimates ``tr(H_{TT})`` (the variance from
    ``H_{TT}``'s off-diagonal entries alone); with ``probes[T] = I`` their sum is it exactly."""
    out = {}
    for t, ns in types_of(res.names).items():
        P, got = probes[t], []
        for a in range(0, P.shape[1], columns):
            U = P[:, a : a + columns]
            got.append((U * res.matvec(U, term, rows=ns, cols=ns)).sum(0).double())
        out[t] = torch.cat(got).numpy()
    return out


def head_states(model, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(h (n, d), p (n, V), w (n,))`` of the batch's predicting positions (every sequence's ``L − 1``
    first), each weighted ``1 / (B (L − 1))``: what the unembedding block is built from."""
    from hessviz.pretrained.load import hidden_states

    hs, ps = [], []
    for row in ids:
        Z = hidden_states(model.source, row, dtype=model.dtype, layers=model.layers)[-1]
        at = NextToken(Z, row, model.head)
        s = at.h @ at.E.T
        if at._cap(s) is not None:
            raise ValueError(
                f"{model.name}: a soft-capped head's unembedding block is not the closed form here"
            )
        hs.append(at.h.double())
        ps.append(torch.softmax(s.double(), -1))
    h, p = torch.cat(hs), torch.cat(ps)
    return h, p, torch.full((h.shape[0],), 1.0 / h.shape[0], dtype=torch.float64)


def unembedding_trace(h: Tensor, p: Tensor, w: Tensor) -> float:
    r"""``tr H_out = Σ_t w_t (1 − ‖p_t‖²) ‖h_t‖²``, the unembedding block's trace (outer = full).

    >>> round(unembedding_trace(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 0.5]]), torch.ones(1)), 6)
    2.5
    """
    return float((w * (1 - p.pow(2).sum(-1)) * h.pow(2).sum(-1)).sum())


def exact(model, ids: Tensor, probes: int, seed: int = 0, log=lambda s: None) -> dict:
    """The true loss's ``tr(H_TT)/m_T`` per type for ``outer`` and ``full`` (Hutchinson, ``probes``
    Rademacher probes, each value's standard error) and the unembedding's closed-form trace and top
    eigenvalue."""
    import hessviz as hv
    from hessviz.experiments.tensor_types import unembedding_top
    from hessviz.matfree.probes import rademacher

    names = tuple(n for n in model.names if block_type(n) is not None)
    t0 = time.perf_counter()
    res = hv.model_hessian(model, ids, "next_token", wrt=names)
    log(f"built {res.size} weights in {time.perf_counter() - t0:.0f} s")
    sizes = {t: sum(res.param_size(n) for n in ns) for t, ns in types_of(names).items()}
    gen = torch.Generator().manual_seed(seed)
    like = torch.empty(0, dtype=model.dtype)
    U = {t: rademacher(m, probes, gen, like).T.contiguous() for t, m in sizes.items()}
    out: dict = {"value": float(res.value), "sizes": sizes}
    for term in ("outer", "full"):
        t0 = time.perf_counter()
        q = type_quadratic_forms(res, term, U)
        out[term] = {t: (v / sizes[t]).tolist() for t, v in q.items()}
        log(f"{term}: {probes} probes in {time.perf_counter() - t0:.0f} s; load {os.getloadavg()[0]:.1f}")
    h, p, w = head_states(model, ids)
    V, d = model.head.embedding.shape
    out["emb_out_trace_over_size"] = unembedding_trace(h, p, w) / (V * d)
    t0 = time.perf_counter()
    out["emb_out_top"] = unembedding_top(h, p, w, ncv=8)
    log(f"unembedding top {out['emb_out_top']:.4g} in {time.perf_counter() - t0:.0f} s")
    return out


def run(
    model_name,
    out: pathlib.Path,
    seqs: int,
    tokens: int,
    draws: int,
    probes: int,
    log=print,
    ids: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict:
    """Both metrics on ``model_name`` (a source: a bundled name or a folder) written to ``out`` as JSON,
    on :func:`batch_ids` (or ``ids (B, L)`` when given)."""
    import hessviz as hv

    t0 = time.perf_counter()
    load = list(os.getloadavg())
    model = hv.load_model(model_name, dtype=dtype)
    ids = batch_ids(model_name, seqs, tokens) if ids is None else ids
    state = {
        "model": str(model_name),
        "texts": [s for s, _ in TEXTS[:seqs]],
        "ids": ids.tolist(),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "draws": draws,
        "probes": probes,
        "load_average_start": load,
    }
    state["gnb"] = gnb(model, ids, draws, log)
    state["exact"] = exact(model, ids, probes, log=log)
    state["seconds"] = time.perf_counter() - t0
    state["load_average_end"] = list(os.getloadavg())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(state, indent=1) + "\n")
    return state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="default: sharpness-<model>.json here")
    ap.add_argument("--seqs", type=int, default=SEQS)
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--draws", type=int, default=3, help="GNB label draws")
    ap.add_argument("--probes", type=int, default=4, help="Hutchinson probes per term")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or pathlib.Path(f"sharpness-{args.model}.json")
    st = run(
        args.model, out, args.seqs, args.tokens, args.draws, args.probes, log=lambda s: print(s, flush=True)
    )
    print(f"wrote {out} in {st['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
