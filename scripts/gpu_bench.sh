#!/usr/bin/env bash
# The matrix-free bench rows and the CUDA-only tests on a CUDA machine (issue 10, goal 3).
#
# Two steps, from the repository root:
#   PYTHON=.venv/bin/python scripts/gpu_bench.sh --prepare   # HERE (network): fetch the wheel(s) hessviz imports that the
#                                    # device image lacks (plotly) into .whl/ (git-ignored locally)
#   scripts/gpu_bench.sh             # THERE (no network, its own CUDA torch): install .whl/, run the
#                                    # CUDA tests, then the bench rows on cuda
# With the device tool (about 2-3 min on an H200; timeout_s=420 leaves room for a rerun):
#   run(command="bash scripts/gpu_bench.sh", carry=[".whl"], timeout_s=420)
# It writes benchmarks/MATFREE_GPU.md (+ .json) and, when $OUT is set, copies them and the log
# there so that they come back. Knobs: GPU_BENCH_REPEATS (default 15), GPU_BENCH_SPECTRAL_LEN
# (default 128; 0 skips the eigsh/SLQ rows).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [[ "${1:-}" == "--prepare" ]]; then
    exclude="$(git rev-parse --git-common-dir)/info/exclude"
    grep -qxF "/.whl/" "$exclude" 2>/dev/null || echo "/.whl/" >> "$exclude"
    mkdir -p .whl
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "plotly==7.1.0"
    ls -l .whl
    exit 0
fi

LOG=${OUT:-benchmarks}/gpu_bench.log
mkdir -p benchmarks "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1

if ! $PY -c "import plotly" 2>/dev/null; then
    [[ -d .whl ]] || { echo "plotly missing and no .whl/: run scripts/gpu_bench.sh --prepare here and carry .whl"; exit 2; }
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"     # this checkout's hessviz, no install needed
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, hessviz; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), hessviz.__file__)"
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"

echo "== CUDA-only tests"
$PY -m pytest -q -p no:cacheprovider -o addopts="" --timeout 300 -rs \
    "tests/test_block.py::test_cuda_matches_cpu" tests/test_matfree.py -k cuda

echo "== matfree bench rows on cuda"
$PY -m hessviz.matfree.bench --device cuda --out benchmarks/MATFREE_GPU.md \
    --repeats "${GPU_BENCH_REPEATS:-15}" --spectral-len "${GPU_BENCH_SPECTRAL_LEN:-128}" --threads 8
cat benchmarks/MATFREE_GPU.md
if [[ -n "${OUT:-}" ]]; then cp benchmarks/MATFREE_GPU.md benchmarks/MATFREE_GPU.json "$OUT"/; fi
