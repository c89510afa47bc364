#!/usr/bin/env bash
# The generation benchmark (bench/generate.py) on a CUDA device, with a model and a
# workload sized for a GPU: HF generate one at a time, HF generate in static batches
# and Conveyor's engine, side by side. Needs a CUDA build of torch in the environment
# (the project's default venv pins the CPU build). Extra flags are passed through, e.g.
#   bench/generate_cuda.sh --num-requests 512 --static-batch-size 64
# Writes bench/results/cuda/generate.json and generate.png.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device")'
exec "$PYTHON" -m bench.generate \
    --device cuda \
    --dtype bfloat16 \
    --model gpu \
    --num-requests 256 \
    --sequential-requests 32 \
    --static-batch-size 32 \
    --max-num-seqs 256 \
    --max-num-batched-tokens 4096 \
    --kv-cache-tokens 262144 \
    --out bench/results/cuda \
    "$@"
