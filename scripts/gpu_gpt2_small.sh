#!/usr/bin/env bash
# Issue 36's GPU rows: benchmarks/gpt2_small.py on cuda at curvlinops' 4 x 1024 tokens, and the torchrun
# recipe of docs/distributed.md. NOT RUN YET: no device was lent to the session that wrote it.
#
# Two steps, from the repository root:
#   PYTHON=.venv/bin/python scripts/gpu_gpt2_small.sh --prepare   # HERE (network): the peers' wheels into
#       .whl/ (git-ignored). The random checkpoint (~500 MB, over the carry limit) is rebuilt THERE from its
#       seed by benchmarks/gpt2_small.py, which needs transformers in the device image.
#   scripts/gpu_gpt2_small.sh                                      # THERE: install .whl/, run the rows
# With the device tool (budget: about 6-8 min on an H200, one call):
#   run(command="bash scripts/gpu_gpt2_small.sh", carry=[".whl"], timeout_s=540)
# Output: gpt2_small_gpu.log and gpt2_small_gpu.jsonl under $OUT (or benchmarks/).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
source scripts/device_wheels.sh
if [[ "${1:-}" == "--prepare" ]]; then
    download_wheels "hessian-eigenthings==1.0.0a5" "curvlinops-for-pytorch==3.0.1" "einops==0.8.2" \
        "einconv==0.1.0" "linear_operator==0.6.1"
    ls -l .whl
    exit 0
fi

DIR=${OUT:-benchmarks}
LOG=$DIR/gpt2_small_gpu.log
mkdir -p "$DIR"
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
install_wheels
nvidia-smi --query-gpu=name,memory.total --format=csv
# one product, one gradient and peak memory of each method, 4 x 1024 tokens, float32
timeout 240 $PY benchmarks/gpt2_small.py --device cuda --tokens 4x1024 --repeats 5 --json "$DIR/gpt2_small_gpu.jsonl" || true
# top-5 eigenvalues against the peers (1e-3 relative), 4 x 256 tokens to fit the budget
timeout 180 $PY benchmarks/gpt2_small.py --device cuda --tokens 4x256 --methods top5 --json "$DIR/gpt2_small_gpu.jsonl" || true
# the recipe at 1 and 2 ranks (gloo: NCCL needs one GPU per rank, and one GPU is lent); the same numbers
for n in 1 2; do
    timeout 60 torchrun --standalone --nproc-per-node "$n" scripts/distributed_hessian.py pydoc-llama --batch 3 \
        --backend gloo --wrt l0.W_Q l1.W_2 || true
done
