"""The dense-size guard: estimate the bytes a result needs and refuse before allocating.

The limit is, in order of precedence, what :func:`set_memory_limit` set, the
environment variable ``HESSVIZ_MEMORY_LIMIT`` (bytes, or a number with a unit such as
``512MiB`` or ``4GB``), or by default half of the memory available now on the device
(``MemAvailable`` on the CPU, free memory on a CUDA device).
"""

from __future__ import annotations

import os
import re

import torch

from hessviz.errors import SizeError

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_user_limit: int | None = None


def parse_bytes(text: str | int) -> int:
    """``"512MiB" -> 536870912``; plain integers are bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
        if not m or m.group(2).upper() not in _UNITS:
            raise ValueError(
                f"memory limit must be bytes or a number with a unit "
                f"({', '.join(u for u in _UNITS if u)}), got {text!r}"
            )
        value, unit = float(m.group(1)), m.group(2).upper()
    if value <= 0:
        raise ValueError(f"memory limit must be > 0, got {text!r}")
    return int(value * _UNITS[unit])


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def set_memory_limit(limit: int | str | None) -> None:
    """Cap what one dense result may use (bytes or e.g. ``"2GiB"``); ``None`` restores the default."""
    global _user_limit
    _user_limit = None if limit is None else parse_bytes(limit)


def _available_cpu() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def memory_limit(device: torch.device | str = "cpu") -> int:
    """The byte limit for one dense result on ``device``."""
    if _user_limit is not None:
        return _user_limit
    env = os.environ.get("HESSVIZ_MEMORY_LIMIT")
    if env:
        return parse_bytes(env)
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    return _available_cpu() // 2


def check_fits(what: str, needed: int, device: torch.device | str, advice: str) -> None:
    """Raise :class:`SizeError` when ``needed`` bytes exceed the limit on ``device``."""
    limit = memory_limit(device)
    if needed > limit:
        raise SizeError(
            f"{what} needs about {format_bytes(needed)}, over the limit of {format_bytes(limit)} "
            f"(hessviz.set_memory_limit or HESSVIZ_MEMORY_LIMIT sets it); {advice}",
            needed_bytes=needed,
            limit_bytes=limit,
        )
