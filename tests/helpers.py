"""Comparisons that explain themselves on failure."""

from __future__ import annotations

import torch


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, rtol: float, what: str, atol: float = 0.0
) -> None:
    """Frobenius error ``‖a − e‖ ≤ rtol ‖e‖ + atol`` (relative unless ``e`` is at round-off level).

    On failure, report the error, the worst entry and both values there.
    """
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    diff = (actual - expected).abs()
    scale = float(torch.linalg.norm(expected))
    distance = float(torch.linalg.norm(actual - expected))
    err = distance / (scale if scale > 0 else 1.0)
    if not distance <= rtol * scale + atol:
        idx = tuple(int(i) for i in torch.unravel_index(torch.argmax(diff), diff.shape))
        raise AssertionError(
            f"{what}: relative error {err:.3e} > {rtol:.0e} (atol {atol:.0e}); worst entry {idx}: "
            f"closed form {float(actual[idx]):.6e}, reference {float(expected[idx]):.6e}"
        )
