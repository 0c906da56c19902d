"""``hv.HessianOperator`` (``MODEL.md`` part 4, "One operator"): one type for a block result, a whole
model and the autograd reference; ``@``, blocks, sums, scaling, the scipy and curvlinops views and
``dense`` against the dense terms; the spectral tools on an operator against the same tools on the
result; and a new engine as one subclass with one ``_matmat`` (double backward through autograd)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import hessviz as hv
from hessviz import matfree, reference
from hessviz.block.terms import NAMES as TERMS
from hessviz.dense.assembly import DenseHessian
from hessviz.dense.autograd import AutogradHessian
from hessviz.dense.stack import StackHessian
from hessviz.errors import ConfigError, SizeError
from hessviz.products.autograd import AutogradOperator
from hessviz.products.hessian_operator import DenseOperator, HessianOperator, ProductsOperator
from hessviz.products.operator import MatrixFreeHessian, TapeOperator

TOL = 1e-12
CFG = hv.BlockConfig(
    seq_len=4, d_model=6, d_k=2, d_ff=8, n_heads=3, out_proj=True, norm="pre", ln_affine=True
)
WRT = ("W_Q", "W_V", "ln2_gamma", "W_1")  # θ order


@pytest.fixture(scope="module")
def res() -> hv.HessianResult:
    params = hv.init_params(CFG, seed=1)
    X, Y = hv.sample_inputs(CFG, seed=1)
    return hv.hessian(CFG, params, X, Y, wrt=WRT)


def close(a, b) -> bool:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max()) <= TOL * max(1.0, float(b.abs().max()))


def test_products_blocks_and_algebra_match_the_dense_terms(res):
    op = res.operator()
    assert isinstance(op, hv.HessianOperator) and op.shape == (res.size, res.size)
    assert (op.dtype, op.device, op.term, op.rows) == (torch.float64, torch.device("cpu"), "full", WRT)
    gen = torch.Generator().manual_seed(0)
    V = torch.randn(res.size, 3, generator=gen, dtype=torch.float64)
    assert close(op @ V, res.full @ V) and close(op @ V[:, 0], res.full @ V[:, 0])
    assert close(op @ V.numpy(), res.full @ V)  # numpy in, tensor out
    # blocks of names and head slices, and the transpose of an off-diagonal block
    rows, cols = res.offsets["W_V"], res.offsets["W_1"]
    block = op.block("W_V", "W_1")
    assert block.shape == (rows.stop - rows.start, cols.stop - cols.start)
    assert close(block.dense(), res.full[rows, cols]) and close(block.T.dense(), res.full[cols, rows])
    head = op.block(("W_Q[1]",), ("W_Q[1]", "ln2_gamma"))
    expected = torch.cat([res.block("W_Q[1]", "W_Q[1]"), res.block("W_Q[1]", "ln2_gamma")], 1)
    assert close(head.dense(), expected)
    # sums, scaling, differences: outer + functional is full
    parts = res.operator("outer") + res.operator("functional")
    assert parts.term == "outer + functional" and close(parts.dense(), res.full)
    assert close((2 * op - res.operator("outer")).dense(), 2 * res.full - res.outer)
    assert close((-op).block("W_V", "W_1").dense(), -res.full[rows, cols])
    assert close(op.dense(), res.full)


def test_scipy_view_and_the_old_faces_are_the_operator(res):
    op = res.operator("functional")
    x = np.linspace(-1, 1, res.size)
    assert np.allclose(op.to_scipy().matvec(x), res.functional.numpy() @ x, rtol=0, atol=1e-12)
    lin = op.block("W_V", "ln2_gamma").to_scipy()
    rows, cols = res.offsets["W_V"], res.offsets["ln2_gamma"]
    y = np.ones(cols.stop - cols.start)
    assert np.allclose(lin.matvec(y), res.functional[rows, cols].numpy() @ y, rtol=0, atol=1e-12)
    z = np.ones(rows.stop - rows.start)
    assert np.allclose(lin.rmatvec(z), res.functional[rows, cols].numpy().T @ z, rtol=0, atol=1e-12)
    assert np.allclose(res.block_operator("W_V", "ln2_gamma", "functional").matvec(y), lin.matvec(y))
    assert close(res.matvec(torch.eye(res.size, dtype=torch.float64), "functional"), res.functional)


def test_the_autograd_reference_is_the_same_type(res):
    params = hv.init_params(CFG, seed=1)
    X, Y = hv.sample_inputs(CFG, seed=1)
    ref = hv.hessian(CFG, params, X, Y, wrt=WRT, method="autograd").operator()
    assert isinstance(ref, HessianOperator) and isinstance(res.operator(), HessianOperator)
    assert type(ref) is AutogradOperator and type(res.operator()) is TapeOperator  # chosen by class
    assert close(ref.block("W_Q[2]", "W_1").dense(), res.block("W_Q[2]", "W_1"))


def test_the_dense_terms_are_one_more_engine(res):
    """A result holds its dense terms as operators: ``dense()`` is the term, ``@`` its product, a block
    its block, and the spectral tools take them as they take the products."""
    terms = res.dense_terms
    assert all(type(terms[t]) is DenseHessian and terms[t].term == t for t in TERMS)
    assert terms["full"].dense() is res.full and terms["outer"].dense() is res.outer  # formed once
    V = torch.randn(res.size, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert close(terms["functional"] @ V, res.functional @ V)
    assert close(terms["outer"].block("W_Q[1]", "W_1").dense(), res.block("W_Q[1]", "W_1", "outer"))
    assert close((terms["outer"] + terms["functional"]).dense(), res.full)
    top = matfree.top_eigenvalues(terms["full"], k=2, solver="torch")
    assert np.allclose(top, matfree.top_eigenvalues(res.operator(), k=2, solver="torch"), rtol=1e-9)
    with pytest.raises(ConfigError, match="not in this result's names"):
        terms["full"].block("W_K", "W_1")
    params = hv.init_params(CFG, seed=1)
    X, Y = hv.sample_inputs(CFG, seed=1)
    ref = hv.hessian(CFG, params, X, Y, wrt=("W_V", "W_1"), method="autograd")
    assert type(ref.dense_terms["outer"]) is AutogradHessian
    fresh = hv.hessian(CFG, params, X, Y, wrt=("W_V", "W_1"))
    alone = fresh.dense_terms["functional"].block("W_V", "W_1").dense()  # computed alone: nothing formed
    assert not fresh.dense_terms["full"].formed
    assert close(alone, ref.block("W_V", "W_1", "functional"))
    stack = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, d_ff=3, n_layers=2)
    sres = hv.hessian(stack, hv.init_params(stack, seed=0), *hv.sample_inputs(stack, seed=0), wrt=("l0.W_Q",))
    assert type(sres.dense_terms["full"]) is StackHessian and sres.dense_terms["full"].dense() is sres.full


def _operator_classes() -> list[type]:
    seen, todo = [], [HessianOperator]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo += cls.__subclasses__()
    return seen


def test_every_operator_class_is_abstract_or_final():
    """As equinox has it: an operator class is abstract or ``@final``, and none overrides a concrete
    method of a parent (abstract methods are implemented, ``__init__`` extends)."""
    for cls in _operator_classes():
        if cls.__module__.startswith("tests."):
            continue  # the toy engines of this module
        assert inspect.isabstract(cls) or getattr(cls, "__final__", False), f"{cls.__name__} is neither"
        for name, value in vars(cls).items():
            if name.startswith("__") or not callable(value) and not isinstance(value, property):
                continue
            for parent in cls.__mro__[1:]:
                if name in vars(parent):
                    inherited = vars(parent)[name]
                    abstract = getattr(inherited, "__isabstractmethod__", False)
                    assert abstract, f"{cls.__name__}.{name} overrides {parent.__name__}.{name}"
                    break


def test_spectral_tools_take_an_operator_and_agree_with_the_result(res):
    op = res.operator()
    a, b = matfree.eigenpairs(op, k=3, solver="torch"), matfree.eigenpairs(res, "full", k=3, solver="torch")
    assert np.allclose(a.values, b.values, rtol=1e-10) and a.term == "full"
    assert np.allclose(a.values, torch.linalg.eigvalsh(res.full).numpy()[-3:], rtol=1e-8)
    t1, t2 = matfree.trace(op, samples=12), matfree.trace(res, "full", samples=12)
    assert t1.value == t2.value
    d1, d2 = matfree.density(op, probes=2, steps=6), matfree.density(res, probes=2, steps=6)
    assert np.allclose(d1.all_nodes, d2.all_nodes, rtol=1e-12)
    table = matfree.block_table(op)
    assert [r.name for r in table.rows] == list(matfree.block_names(res))
    assert np.allclose([r.top for r in table.rows], [r.top for r in matfree.block_table(res).rows], rtol=1e-9)
    # a block of the operator by name, and an operator of another term
    w = matfree.top_eigenvalues(res.operator("outer"), k=1, names=("W_V",))
    rows = res.offsets["W_V"]
    assert abs(w[0] - float(torch.linalg.eigvalsh(res.outer[rows, rows])[-1])) <= 1e-8 * abs(w[0])
    with pytest.raises(ConfigError, match="carries its term"):
        matfree.eigenpairs(op, "outer", k=1)


def test_bad_uses_get_one_clear_error(res):
    op = res.operator()
    with pytest.raises(ConfigError, match="not in this result"):
        op.block("W_O")
    with pytest.raises(ConfigError, match="different names"):
        op + op.block("W_V")
    with pytest.raises(TypeError):
        op * "2"
    with pytest.raises(ConfigError, match="at least one name"):
        op.block(())
    with pytest.raises(hv.InputError, match=rf"shape \({res.size},\)"):
        op @ torch.ones(3, dtype=torch.float64)
    limit = hv.memory_limit()
    try:
        hv.set_memory_limit(1000)
        with pytest.raises(SizeError, match="op.block"):
            op.dense()
    finally:
        hv.set_memory_limit(limit)


class DoubleBackward(ProductsOperator):
    """A new engine in one subclass with one method: ``H V`` by double backward through the autograd
    reference (``hv.reference``'s forward and loss), at the point of a result's products; names,
    head slices, blocks,
    transposes and the count of products come from :class:`ProductsOperator`."""

    def _matmat(self, V, out=None):
        point = self.products
        leaves, grads = point.kept(DoubleBackward, lambda: self._graph(point))
        dparams = self.col_layout.scatter(V)
        names = point.cfg.param_names
        rows = []
        for j in range(V.shape[0]):
            tangents = [dparams[n][j] if n in dparams else torch.zeros_like(w) for n, w in zip(names, leaves)]
            rows.append(torch.autograd.grad(grads, leaves, grad_outputs=tangents, retain_graph=True))
        prods = {n: torch.stack([r[i] for r in rows]) for i, n in enumerate(names)}
        return self.row_layout.gather(prods, V.shape[0], V, out)

    @staticmethod
    def _graph(point):
        with torch.enable_grad():
            leaves = [point.params[n].detach().clone().requires_grad_() for n in point.cfg.param_names]
            Z = reference.torch_forward(point.cfg, dict(zip(point.cfg.param_names, leaves)), point.X)
            loss = reference.torch_loss(point.cfg, Z, point.Y)
            return leaves, torch.autograd.grad(loss, leaves, create_graph=True)


def test_a_new_engine_is_one_subclass_with_one_matmat(res):
    """The toy engine above is the whole of a new engine: a point's products take it by its class."""
    params = hv.init_params(CFG, seed=1)
    X, Y = hv.sample_inputs(CFG, seed=1)
    ref = hv.hessian(CFG, params, X, Y, wrt=WRT)
    point = MatrixFreeHessian(CFG, ref.products.params, ref.products.X, ref.products.Y, WRT, DoubleBackward)
    engine = point.operator().block(("W_V[1]", "W_1"), ("W_V", "W_1"))
    assert type(engine) is DoubleBackward and engine.rows == ("W_V[1]", "W_1")
    block = ref.operator().block(("W_V[1]", "W_1"), ("W_V", "W_1"))
    assert close(engine.dense(), block.dense()) and close(engine.T.dense(), block.dense().T)
    assert point.matvecs == engine.shape[1] + engine.shape[0]
    square = point.operator().block(("W_V", "W_1"))
    top = matfree.top_eigenvalues(square, k=2, solver="torch")
    assert np.allclose(
        top, matfree.top_eigenvalues(ref.operator().block(("W_V", "W_1")), k=2, solver="torch"), rtol=1e-9
    )
    assert close(
        (square - ref.operator().block(("W_V", "W_1"))).dense(),
        torch.zeros(square.shape, dtype=torch.float64),
    )


def test_dense_operator_blocks_by_name(res):
    sizes = {n: CFG.param_size(n) for n in WRT}
    op = DenseOperator(res.full, WRT, sizes=sizes)
    rows, cols = res.offsets["W_1"], res.offsets["W_Q"]
    assert close(op.block("W_1", "W_Q").dense(), res.full[rows, cols])
    assert matfree.trace(op, samples=res.size).value == pytest.approx(float(torch.trace(res.full)), rel=1e-12)


def test_a_whole_models_operator_speaks_its_public_names(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tests.test_pretrained import randomise

    cfg = transformers.GPT2Config(vocab_size=30, n_embd=8, n_layer=1, n_head=2, n_positions=16)
    ref = transformers.GPT2LMHeadModel(cfg)
    randomise(ref, seed=5)
    ref.save_pretrained(tmp_path)
    model = hv.load_model(tmp_path)
    res = hv.model_hessian(model, torch.tensor([3, 17, 5, 29, 11, 2]), wrt=("l0.W_Q", "l0.ln2_gamma"))
    op = res.operator()
    assert op.rows == ("l0.W_Q", "l0.ln2_gamma") and op.shape == (res.size, res.size)
    H = res.dense()
    assert close(op.dense(), H)
    assert op.block_names() == ("l0.W_Q[0]", "l0.W_Q[1]", "l0.ln2_gamma")
    head = op.block("l0.W_Q[1]", "l0.ln2_gamma")
    assert head.rows == ("l0.W_Q[1]",) and head.shape == (32, 8)
    rows = res.cfg.head_indices("W_Q[1]")  # a head's entries inside vec_r(W_Q)
    assert close(head.dense(), H[rows, 64:])
    table = matfree.block_table(op)
    assert [r.name for r in table.rows] == list(op.block_names())
    assert abs(table.rows[-1].top - float(torch.linalg.eigvalsh(H[64:, 64:])[-1])) <= 1e-9


def test_curvlinops_estimators_run_on_the_operator(res):
    curvlinops = pytest.importorskip("curvlinops")
    view = res.operator().to_curvlinops()
    eye = torch.eye(res.size, dtype=torch.float64)
    assert close(view @ eye, res.full)
    assert close(view.adjoint() @ eye, res.full)
    off = res.operator().block("W_V", "W_1").to_curvlinops()
    rows, cols = res.offsets["W_V"], res.offsets["W_1"]
    assert close(off.adjoint() @ torch.eye(rows.stop - rows.start, dtype=torch.float64), res.full[cols, rows])
    torch.manual_seed(0)  # Hutch++ from 120 of hessviz's products
    estimate = float(curvlinops.hutchpp_trace(view, num_matvecs=120))
    assert estimate == pytest.approx(float(torch.trace(res.full)), rel=0.02)
