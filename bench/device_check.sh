#!/usr/bin/env bash
# The GPU device check, sized to finish within 9 minutes on one H200 whose image has its
# own CUDA build of PyTorch, transformers, peft and safetensors, no network and none of
# Conveyor's install. Run `make device-wheels` first, where there is a network, and carry
# ./wheels with the repository. Steps (each under its own time limit; one failing does
# not stop the others):
#   1. install Conveyor and what the image lacks from ./wheels into a private folder
#      (--no-index --no-deps: nothing is downloaded, torch is never touched);
#   2. the engine's parity tests on CUDA in float32 (greedy output equals HF generate
#      token for token), then again in bfloat16 (informational: bf16 rounding may flip
#      a near-tie, so its failures are recorded, not counted), then the varlen kernel
#      (FlashInfer or flash-attn, where installed) against Conveyor's attention
#      (informational), and decode steps replayed from CUDA graphs;
#   3. a random-weight checkpoint of Llama-3-8B's shape in bfloat16 (bench.big_checkpoint);
#   4. the batch-1 decode step against the weight-streaming bound (bench.decode_bound);
#   5. the generation benchmark, 256 concurrent requests, Conveyor against HF `generate`
#      in static batches (bench.generate).
# JSON lands in $OUT (when set) or bench/results/device, with device_check.json listing
# every step's status and duration.
#   bench/device_check.sh             # on the GPU host
#   bench/device_check.sh --dry-run   # here: the same steps on the CPU, tiny model
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-wheels}"
RESULTS="${OUT:-bench/results/device}"
WORK="${WORK:-$(mktemp -d /tmp/conveyor-device-check.XXXXXX)}"
DRY_RUN=0
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1
mkdir -p "$RESULTS" "$WORK"
STEPS="$RESULTS/steps.tsv"
: > "$STEPS"
export PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

if ((DRY_RUN)); then
    DEVICE=cpu DTYPE=float32 MODEL=tiny-8b-shape
    PARITY_S=300 BUILD_S=120 BOUND_S=120 BENCH_S=300
    BOUND_ARGS=(--prompt-tokens 16 --output-tokens 16)
    BENCH_ARGS=(--num-requests 8 --prompt-tokens 4-32 --output-tokens 2-8 --static-batch-size 4
                --max-num-seqs 8 --max-num-batched-tokens 64 --kv-cache-tokens 2048)
else
    DEVICE=cuda DTYPE=bfloat16 MODEL=llama3-8b
    PARITY_S=80 BUILD_S=90 BOUND_S=50 BENCH_S=210
    BOUND_ARGS=(--prompt-tokens 128 --output-tokens 128)
    BENCH_ARGS=(--num-requests 256 --prompt-tokens 16-512 --output-tokens 16-256
                --static-batch-size 32 --max-num-seqs 256 --max-num-batched-tokens 4096
                --kv-cache-tokens 262144)
fi

# step NAME LIMIT_S COMMAND...: run with a time limit, record status and seconds.
step() {
    local name=$1 limit=$2 started rc
    shift 2
    started=$(date +%s)
    echo "== $name (limit ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
    rc=$?
    tail -n 5 "$RESULTS/$name.log"
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - started))" >> "$STEPS"
    return "$rc"
}

# 1. Versions, then Conveyor and the missing or older packages from ./wheels.
"$PYTHON" - <<'PY' > "$RESULTS/environment.txt" 2>&1
import platform, sys
import torch
print("python", sys.version.split()[0], platform.machine())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.mem_get_info())
for name in ("transformers", "peft", "safetensors", "tokenizers", "numpy"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "?"))
    except ImportError:
        print(name, "MISSING")
PY
cat "$RESULTS/environment.txt"
SITE="$WORK/site"
install_wheels() {
    local needed
    needed=$("$PYTHON" - "$WHEELS" <<'PY'
import pathlib, sys
from importlib import metadata

def version_key(text):
    return tuple(int(part) if part.isdigit() else 0 for part in text.split(".")[:3])

needed = set()
for wheel in pathlib.Path(sys.argv[1]).glob("*.whl"):
    name, version = wheel.name.split("-")[:2]
    try:
        present = metadata.version(name)
    except metadata.PackageNotFoundError:
        present = None
    if name == "conveyor" or present is None or version_key(present) < version_key(version):
        needed.add(f"{name}=={version}")
print(" ".join(sorted(needed)))
PY
)
    echo "installing into $SITE: $needed"
    # shellcheck disable=SC2086  # a list of requirement strings
    "$PYTHON" -m pip install --quiet --no-index --no-deps --find-links "$WHEELS" \
        --target "$SITE" $needed
}
if [[ -d "$WHEELS" ]]; then
    started=$(date +%s)
    install_wheels
    printf 'install\t%s\t%s\n' "$?" "$(($(date +%s) - started))" >> "$STEPS"
    export PYTHONPATH="$SITE"
elif ((DRY_RUN)); then
    echo "no $WHEELS/: using the current environment and src/"
    export PYTHONPATH="src"
else
    echo "no $WHEELS/ folder: run 'make device-wheels' where there is a network" >&2
    exit 2
fi
"$PYTHON" -c 'import conveyor, sys; print("conveyor from", conveyor.__file__)'

# 2. Parity with HF generate on the device (float32 counted, bfloat16 informational).
PARITY=(tests/unit/engine/model/test_llama_parity.py tests/unit/engine/test_llm_engine_parity.py)
PYTEST=(-q -p no:cacheprovider -p no:timeout -o addopts= -W ignore::DeprecationWarning)
CONVEYOR_TEST_DEVICE=$DEVICE CONVEYOR_TEST_DTYPE=float32 step parity_float32 "$PARITY_S" \
    "$PYTHON" -m pytest "${PYTEST[@]}" --junitxml="$RESULTS/parity_float32.xml" "${PARITY[@]}"
if ((!DRY_RUN)); then
    CONVEYOR_TEST_DEVICE=$DEVICE CONVEYOR_TEST_DTYPE=bfloat16 step parity_bfloat16 35 \
        "$PYTHON" -m pytest "${PYTEST[@]}" --junitxml="$RESULTS/parity_bfloat16.xml" \
        tests/unit/engine/model/test_llama_parity.py
fi

# 2b. Decode steps replayed from CUDA graphs (around a stand-in kernel: any GPU), then
# the GPU's varlen kernel (FlashInfer or flash-attn, where the image or ./wheels has one)
# in bfloat16 against Conveyor's attention (informational; skipped, the reason in the
# log, where neither is installed). In a dry run both are skipped tests (no CUDA).
step cuda_graphs 40 "$PYTHON" -m pytest "${PYTEST[@]}" -rs \
    --junitxml="$RESULTS/cuda_graphs.xml" tests/unit/engine/model/test_decode_graphs.py -k cuda
step varlen_kernel 40 "$PYTHON" -m pytest "${PYTEST[@]}" -rs \
    --junitxml="$RESULTS/varlen_kernel.xml" \
    tests/unit/engine/model/test_model_runner_varlen.py -k cuda

# 3-5. The Llama-3-8B-shaped checkpoint, the batch-1 bound, the 256-request benchmark.
CHECKPOINT="$WORK/checkpoint"
if step checkpoint "$BUILD_S" "$PYTHON" -m bench.big_checkpoint --model "$MODEL" \
        --device "$DEVICE" --dtype "$DTYPE" --out "$CHECKPOINT"; then
    step decode_bound "$BOUND_S" "$PYTHON" -m bench.decode_bound --checkpoint "$CHECKPOINT" \
        --device "$DEVICE" --dtype "$DTYPE" "${BOUND_ARGS[@]}" --out "$RESULTS"
    step generate "$BENCH_S" "$PYTHON" -m bench.generate --checkpoint "$CHECKPOINT" \
        --device "$DEVICE" --dtype "$DTYPE" --contenders hf_static,conveyor --patterns burst \
        "${BENCH_ARGS[@]}" --out "$RESULTS"
fi

"$PYTHON" - "$STEPS" "$RESULTS/device_check.json" "$DRY_RUN" <<'PY'
import json, pathlib, sys
rows = [line.split("\t") for line in pathlib.Path(sys.argv[1]).read_text().splitlines()]
steps = {name: {"exit_code": int(rc), "seconds": int(s)} for name, rc, s in rows}
counted = [name for name in steps if name not in ("parity_bfloat16", "varlen_kernel")]
document = {"dry_run": sys.argv[3] == "1", "steps": steps,
            "passed": all(steps[name]["exit_code"] == 0 for name in counted)}
pathlib.Path(sys.argv[2]).write_text(json.dumps(document, indent=2) + "\n")
print(json.dumps(document))
PY
rm -rf "$WORK/checkpoint"
