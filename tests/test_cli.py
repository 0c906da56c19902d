"""The command line, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from hessviz.bench import dense
from hessviz.cli import main


def test_compute_writes_terms_and_summary(tmp_path, capsys):
    out = tmp_path / "run" / "pre"
    assert (
        main(
            [
                "compute",
                "--norm",
                "pre",
                "-L",
                "4",
                "-d",
                "6",
                "--d-k",
                "3",
                "--d-ff",
                "5",
                "--activation",
                "gelu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    data = np.load(out.with_suffix(".npz"))
    P = 2 * 6 * 3 + 36 + 2 * 6 * 5
    assert data["full"].shape == (P, P)
    np.testing.assert_allclose(data["outer"] + data["functional"], data["full"], atol=1e-14)
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["P"] == P and summary["names"] == ["W_Q", "W_K", "W_V", "W_1", "W_2"]
    assert summary["terms"]["outer"]["negative_eigenvalues"] == 0
    assert summary["terms"]["full"]["min_eigenvalue"] < 0  # non-convex
    assert len(summary["terms"]["full"]["block_norms_spectral"]) == 5
    assert '"negative_eigenvalues"' in capsys.readouterr().out


def test_verify_prints_the_table_and_passes(capsys):
    assert main(["verify", "--norm", "attention", "--loss", "ce", "-L", "3", "-d", "4", "--d-k", "2"]) == 0
    text = capsys.readouterr().out
    assert "W_Q–W_K" in text and "jacobian" in text and "OK" in text


def test_bad_flags_give_a_message_not_a_traceback():
    run = subprocess.run(
        [sys.executable, "-m", "hessviz", "compute", "-L", "0"], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "seq_len must be an integer >= 1" in run.stderr and "Traceback" not in run.stderr


def test_bench_runs_side_by_side_on_a_small_case(tmp_path):
    rows = [
        dense.layernorm_jacobian(4, 6, repeats=1, device=dense.torch.device("cpu")),
        *dense.ffn_jacobian(4, 6, 5, repeats=1, device=dense.torch.device("cpu")),
    ]
    assert all(r.error < 1e-12 for r in rows)
    assert all(r.ours > 0 and all(t > 0 for t in r.baselines.values()) for r in rows)
    table = dense.render(rows, "## t")
    assert "autograd.functional.jacobian" in table and "×" in table


def test_a_llama_style_block_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "llama"
    assert (
        main(
            [
                "compute",
                "--norm",
                "pre",
                "--norm-type",
                "rmsnorm",
                "--ln-affine",
                "--mlp",
                "gated",
                "--activation",
                "silu",
                "--rope",
                "--n-heads",
                "2",
                "--n-kv-heads",
                "1",
                "--out-proj",
                "--bias",
                "Q,K,V",
                "--causal",
                "-L",
                "4",
                "-d",
                "6",
                "--d-k",
                "2",
                "--d-ff",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["names"] == [
        "ln1_gamma",
        "W_Q",
        "b_Q",
        "W_K",
        "b_K",
        "W_V",
        "b_V",
        "W_O",
        "ln2_gamma",
        "W_G",
        "W_1",
        "W_2",
    ]
    assert (
        main(
            [
                "compute",
                "--bias",
                "--no-bias",
                "-L",
                "3",
                "-d",
                "4",
                "--d-k",
                "2",
                "--d-ff",
                "3",
                "--out",
                str(tmp_path / "plain"),
            ]
        )
        == 0
    )
    run = subprocess.run(
        [sys.executable, "-m", "hessviz", "compute", "--bias", "Q,X"], capture_output=True, text=True
    )
    assert run.returncode == 2 and "tuple of distinct names" in run.stderr and "Traceback" not in run.stderr


def test_verify_passes_blocks_that_are_exactly_zero(capsys):
    """A key bias's blocks are exactly zero in closed form and round-off in autograd: not a failure."""
    assert main(["verify", "--bias", "-L", "4", "-d", "6", "--d-k", "3", "--d-ff", "5"]) == 0
    assert "b_K–b_K" in capsys.readouterr().out


def test_relative_error_still_sees_a_wrong_small_block():
    import torch

    from hessviz.checks.verify import relative_error

    ref = torch.full((3, 3), 1e-5)
    assert relative_error(torch.zeros(3, 3), ref, floor=1e-6) > 0.09  # a 100 % error in a small block
    assert relative_error(torch.zeros(3, 3), torch.full((3, 3), 1e-17), floor=1e-6) < 1e-10


def test_norm_peri_from_the_command_line(tmp_path, capsys):
    """``--norm peri`` (MODEL.md part 5): ``compute`` writes the Peri-LN block's terms, whose θ with
    ``--ln-affine`` has the output norms' γ/β in the contract's order, and ``verify`` passes it."""
    out = tmp_path / "peri"
    flags = ["--norm", "peri", "-L", "3", "-d", "4", "--d-k", "2", "--d-ff", "3", "--ln-eps", "1e-5"]
    assert main(["compute", *flags, "--ln-affine", "--out", str(out)]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["names"] == [
        "ln1_gamma", "ln1_beta", "W_Q", "W_K", "W_V", "ln1_out_gamma", "ln1_out_beta",
        "ln2_gamma", "ln2_beta", "W_1", "W_2", "ln2_out_gamma", "ln2_out_beta",
    ]  # fmt: skip
    data = np.load(out.with_suffix(".npz"))
    np.testing.assert_allclose(data["outer"] + data["functional"], data["full"], atol=1e-13)
    capsys.readouterr()
    assert main(["verify", *flags]) == 0
    text = capsys.readouterr().out
    assert "Peri-LN" in text and "OK" in text
    run = subprocess.run(
        [sys.executable, "-m", "hessviz", "compute", "--norm", "perii"], capture_output=True, text=True
    )
    assert run.returncode != 0 and "peri" in run.stderr and "Traceback" not in run.stderr
