#!/usr/bin/env bash
# The matrix-free bench rows and the CUDA-only tests on a CUDA machine (issues 10 and 20).
#
# Two steps, from the repository root:
#   PYTHON=.venv/bin/python scripts/gpu_bench.sh --prepare   # HERE (network, the MiniLM checkpoint):
#       the wheels hessviz and the peers need that the device image lacks (plotly, hessian-eigenthings,
#       PyHessian) into .whl/, and issue 20's layer and texts into .cases/ (both git-ignored locally)
#   scripts/gpu_bench.sh             # THERE (no network, its own CUDA torch): install .whl/, run the
#                                    # CUDA tests, then the bench rows on cuda
# With the device tool (about 3-4 min on an H200; timeout_s=480 leaves room for a rerun):
#   run(command="bash scripts/gpu_bench.sh", carry=[".whl", ".cases"], timeout_s=480)
# It writes benchmarks/MATFREE_GPU.md (+ .json, _SPEED.json), or, when $OUT is set, copies of them there
# (with the log), so that they come back. Knobs: GPU_BENCH_REPEATS (default 15), GPU_BENCH_PRODUCTS (default 1;
# 0 skips benchmarks.matfree's product rows), GPU_BENCH_SPEED_ARGS (extra arguments of benchmarks.matfree_spectra).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
source scripts/device_wheels.sh
CASES=.cases/minilm.pt
if [[ "${1:-}" == "--prepare" ]]; then
    ignore_locally /.cases/
    mkdir -p .cases
    download_wheels "plotly==7.1.0" "hessian-eigenthings==1.0.0a5" "pyhessian==0.1"
    $PY -m benchmarks.matfree_spectra --save-cases "$CASES" --top5-lens 24 --product-lens 24 64 128 --slq-len 128
    ls -l .whl .cases
    exit 0
fi

LOG=${OUT:-benchmarks}/gpu_bench.log
mkdir -p benchmarks "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1

install_wheels
$PY -c "import plotly" 2>/dev/null || { echo "plotly missing: run scripts/gpu_bench.sh --prepare here and carry .whl"; exit 2; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"     # this checkout's hessviz, no install needed
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, hessviz; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), hessviz.__file__)"
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"

# Written where they come back from, row by row (a run cut short keeps the rows it finished).
DEST=benchmarks
if [[ -n "${OUT:-}" ]]; then cp benchmarks/MATFREE_GPU.md benchmarks/MATFREE_GPU.json "$OUT"/; DEST=$OUT; fi

echo "== CUDA-only tests"
$PY -m pytest -q -p no:cacheprovider -o addopts="" --timeout 300 -rs \
    "tests/test_block.py::test_cuda_matches_cpu" tests/test_matfree_products.py tests/test_lanczos.py -k cuda || true

if [[ "${GPU_BENCH_PRODUCTS:-1}" != 0 ]]; then
    echo "== matfree bench product rows on cuda (rewrites MATFREE_GPU.md)"
    $PY -m benchmarks.matfree --device cuda --out "$DEST/MATFREE_GPU.md" \
        --repeats "${GPU_BENCH_REPEATS:-15}" --spectral-len 0 --threads 8
fi

echo "== issue 20's rows on cuda (the section of MATFREE_GPU.md)"
[[ -f "$CASES" ]] || { echo "$CASES missing: run scripts/gpu_bench.sh --prepare here and carry .cases"; exit 2; }
HESSVIZ_SPEED_CASES="$CASES" $PY -m benchmarks.matfree_spectra --device cuda --out "$DEST/MATFREE_GPU.md" \
    --repeats "${GPU_BENCH_REPEATS:-15}" --threads 8 ${GPU_BENCH_SPEED_ARGS:-}
cat "$DEST/MATFREE_GPU.md"
