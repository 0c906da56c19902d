"""The settings table: each block field declared once, read by the CLI, the URL and the sidebar;
the real-layer fields, parameter names, θ order and head slices of MODEL.md part 2."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hessviz as hv
from hessviz import reference
from hessviz.app import settings as app_settings
from hessviz.app import state
from hessviz.block.config import BLOCK_SETTINGS, SETTINGS, parse_name
from hessviz.cli import build_parser


def test_every_block_field_has_one_setting():
    fields = [f.name for f in dataclasses.fields(hv.BlockConfig) if f.init]
    assert [s.name for s in BLOCK_SETTINGS] == fields
    urls = [s.url for s in app_settings.SETTINGS]
    assert len(set(urls)) == len(urls), "URL keys must be unique"


def test_the_library_settings_know_no_app():
    """URL keys, labels, sidebar sections and the app's ranges live in ``hessviz/app/settings.py``:
    each names a library setting, and the library's :class:`~hessviz.block.config.Setting` has none."""
    from hessviz.block.config import Setting

    app_only = {f.name for f in dataclasses.fields(app_settings.AppSetting)} - {
        f.name for f in dataclasses.fields(Setting)
    }
    assert {"url", "label", "app_range", "grid", "section", "relevant"} <= app_only
    assert set(app_settings.SHOWN) <= {s.name for s in SETTINGS}
    assert not hasattr(hv.block.config, "SECTIONS") and not hasattr(hv.block.config, "EPS_GRID")


def test_cli_reads_every_setting():
    args = build_parser().parse_args(
        [
            "compute",
            "-L",
            "5",
            "--heads",
            "2",
            "--out-proj",
            "--bias",
            "--activation",
            "gelu_tanh",
            "--causal",
            "--input-norm",
            "2",
        ]
    )
    assert (args.seq_len, args.n_heads, args.out_proj, args.bias, args.causal) == (5, 2, True, True, True)
    assert args.activation == "gelu_tanh" and args.input_norm == 2.0 and args.ln_affine is False
    for s in SETTINGS:
        assert hasattr(args, s.name), s.name


def test_cli_refuses_a_bad_value_naming_the_field(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compute", "--heads", "0"])
    assert "n_heads must be an integer >= 1" in capsys.readouterr().err


def test_url_round_trip_of_a_real_layer_view():
    view = state.View.from_values(
        {
            "heads": 2,
            "wo": True,
            "bias": True,
            "causal": True,
            "norm": "pre",
            "affine": True,
            "act": "gelu_tanh",
        }
    )
    qs = state.query_string(view.values)
    assert "heads=2" in qs and "wo=true" in qs and "causal=true" in qs and "L=" not in qs
    parsed = {k: state.parse_value(k, v) for k, v in (item.split("=") for item in qs.split("&"))}
    assert state.View.from_values(parsed) == view


@pytest.mark.parametrize(
    "key, text",
    [
        ("L", "100000"),
        ("L", "nan"),
        ("wo", "maybe"),
        ("xnorm", "3"),
        ("norm", "<script>"),
        ("norm", "sandwich"),
        ("heads", "9"),
    ],
)
def test_url_values_the_app_does_not_offer_are_refused(key, text):
    with pytest.raises(ValueError, match=f"^{key}"):
        state.parse_value(key, text)


def test_the_app_offers_peri_ln_with_its_norm_controls():
    """Peri-LN is a placement the app offers (``MODEL.md`` part 5), and its norms take the LayerNorm
    controls (ε, γ/β, the norm type), settled like the other normed placements' (d = 1 with ε = 0)."""
    view = state.View.from_values({"norm": state.parse_value("norm", "peri"), "affine": True})
    assert view.cfg.norm == "peri" and "ln1_out_gamma" in view.cfg.param_names
    assert state.View.from_values({"norm": "peri"}).describe().startswith("Peri-LN")


def test_paper_block_names_and_numbers_are_unchanged():
    cfg = hv.BlockConfig()
    assert cfg.param_names == ("W_Q", "W_K", "W_V", "W_1", "W_2") and cfg.is_paper_block
    assert cfg.param_shapes["W_V"] == (16, 16) and cfg.num_params == 2 * 128 + 256 + 2 * 512


@pytest.mark.parametrize(
    "norm, expected",
    [
        ("post", "W_Q b_Q W_K b_K W_V b_V W_O b_O ln1_gamma ln1_beta W_1 b_1 W_2 b_2 ln2_gamma ln2_beta"),
        ("pre", "ln1_gamma ln1_beta W_Q b_Q W_K b_K W_V b_V W_O b_O ln2_gamma ln2_beta W_1 b_1 W_2 b_2"),
        ("attention", "W_Q b_Q W_K b_K W_V b_V W_O b_O"),
    ],
)
def test_theta_order_of_a_real_layer(norm, expected):
    cfg = hv.BlockConfig(norm=norm, n_heads=2, out_proj=True, bias=True, ln_affine=norm != "attention")
    assert cfg.param_names == tuple(expected.split())


def test_head_slices_address_columns_and_rows_of_head_h():
    cfg = hv.BlockConfig(d_model=6, d_k=2, n_heads=3, out_proj=True, d_v=4, bias=True)
    params = hv.init_params(cfg, seed=0)
    assert cfg.shape_of("W_V[1]") == (6, 4) and cfg.shape_of("W_O[2]") == (4, 6)
    for name, cut in [
        ("W_Q[1]", lambda w: w[:, 2:4]),
        ("W_V[2]", lambda w: w[:, 8:12]),
        ("W_O[1]", lambda w: w[4:8]),
        ("b_K[0]", lambda w: w[0:2]),
    ]:
        whole = params[parse_name(name).base]
        assert torch.equal(whole.reshape(-1)[cfg.head_indices(name)], cut(whole).reshape(-1)), name
    assert cfg.sort_names(["W_O[0]", "b_Q", "W_Q[2]", "W_Q[0]"]) == ("W_Q[0]", "W_Q[2]", "b_Q", "W_O[0]")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n_heads=0), "n_heads"),
        (dict(n_heads=2), "n_heads"),
        (dict(d_v=4), "d_v"),
        (dict(ln_affine=True, norm="none"), "ln_affine"),
        (dict(ln_affine=True, norm="attention"), "ln_affine"),
        (dict(causal="yes"), "causal"),
        (dict(activation="tanh"), "activation"),
    ],
)
def test_bad_real_layer_fields_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        hv.BlockConfig(**kwargs)


@pytest.mark.parametrize(
    "name, message",
    [
        ("W_Q[2]", "head index"),
        ("W_1[0]", "has no heads"),
        ("W_Q[x]", "head slice"),
        ("b_O", "must be one of"),
    ],
)
def test_bad_names_name_what_is_allowed(name, message):
    cfg = hv.BlockConfig(n_heads=2, out_proj=True)
    with pytest.raises(ValueError, match=message):
        cfg.check_name(name)
    with pytest.raises(ValueError):
        cfg.sort_names(["W_Q", "W_Q[0]"])


def test_causal_mask_with_one_token_is_fine():
    cfg = hv.BlockConfig(seq_len=1, causal=True)
    params, (X, _) = hv.init_params(cfg), hv.sample_inputs(cfg)
    assert torch.isfinite(reference.torch_forward(cfg, params, X)).all()


def test_reference_forward_is_torch_multihead_attention():
    cfg = hv.BlockConfig(
        seq_len=5, d_model=6, d_k=2, n_heads=3, out_proj=True, bias=True, causal=True, norm="attention"
    )
    params, (X, _) = hv.init_params(cfg, seed=3), hv.sample_inputs(cfg, seed=3)
    mha = torch.nn.MultiheadAttention(6, 3, bias=True, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([params["W_Q"].T, params["W_K"].T, params["W_V"].T]))
        mha.in_proj_bias.copy_(torch.cat([params["b_Q"], params["b_K"], params["b_V"]]))
        mha.out_proj.weight.copy_(params["W_O"].T)
        mha.out_proj.bias.copy_(params["b_O"])
        future = torch.ones(5, 5, dtype=torch.bool).triu(1)
        expected, _ = mha(X[None], X[None], X[None], attn_mask=future, need_weights=False)
    torch.testing.assert_close(reference.torch_forward(cfg, params, X), expected[0], rtol=0, atol=1e-14)


def test_autograd_reference_of_head_slices_is_the_sub_block_of_the_whole():
    cfg = hv.BlockConfig(
        seq_len=4,
        d_model=4,
        d_k=2,
        d_ff=3,
        n_heads=2,
        out_proj=True,
        bias=True,
        ln_affine=True,
        norm="pre",
        activation="gelu_tanh",
    )
    params, (X, Y) = hv.init_params(cfg, seed=1), hv.sample_inputs(cfg, seed=1)
    names = ("ln1_gamma", "W_Q[1]", "W_O[0]")
    part = hv.hessian(cfg, params, X, Y, wrt=names, method="autograd").full
    whole = hv.hessian(cfg, params, X, Y, method="autograd")
    offsets = cfg.offsets()
    idx = torch.cat([offsets[parse_name(n).base].start + cfg.head_indices(n) for n in names])
    torch.testing.assert_close(part, whole.full[idx][:, idx], rtol=0, atol=1e-13)
