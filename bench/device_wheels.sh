#!/usr/bin/env bash
# Wheels for bench/device_check.sh, into ./wheels (git-ignored): Conveyor itself and the
# few packages its engine tests and generation benchmark import that a CUDA PyTorch image
# (torch, transformers, peft, safetensors and their dependencies) may lack, at the
# versions installed here, for CPython 3.11-3.13 on x86-64 Linux. Every download is
# --no-deps, so no torch (let alone a second CUDA build) is ever fetched.
#   make device-wheels                  # or: bench/device_wheels.sh
#   PLATFORMS="manylinux_2_28_aarch64" bench/device_wheels.sh   # an Arm host (GH200)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
WHEELS="${WHEELS:-wheels}"
PYTHON_VERSIONS="${PYTHON_VERSIONS:-3.11 3.12 3.13}"
PLATFORMS="${PLATFORMS:-manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64}"
# What `import conveyor.engine ...`, pytest and the anyio plugin need beyond the image.
PACKAGES="llguidance orjson prometheus_client pytest pluggy iniconfig pygments packaging
pytest-timeout anyio idna"

rm -rf "$WHEELS" && mkdir -p "$WHEELS"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$WHEELS" .
pins=$("$PYTHON" - $PACKAGES <<'PY'
import sys
from importlib import metadata
print(" ".join(f"{name}=={metadata.version(name)}" for name in sys.argv[1:]))
PY
)
platform_flags=()
for platform in $PLATFORMS; do platform_flags+=(--platform "$platform"); done
for version in $PYTHON_VERSIONS; do
    # shellcheck disable=SC2086  # $pins is a list of requirement strings
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" \
        --python-version "$version" --implementation cp "${platform_flags[@]}" $pins
done
# Optional: FlashInfer, for the varlen kernel step (pure-Python wheels; it builds its
# kernels on the GPU host, so that step may still find it unusable there).
OPTIONAL="${OPTIONAL:-flashinfer-python apache-tvm-ffi ninja nvidia-ml-py einops}"
for version in $PYTHON_VERSIONS; do
    # shellcheck disable=SC2086  # a list of package names
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" \
        --python-version "$version" --implementation cp "${platform_flags[@]}" $OPTIONAL \
        || echo "optional wheels ($OPTIONAL) not downloaded for Python $version"
done
ls -1 "$WHEELS"
du -sh "$WHEELS"
