#!/usr/bin/env bash
# llama.cpp's own OpenAI server, llama-server, built from the llama.cpp sources that
# llama-cpp-python's source release carries (the package registry is the only place this
# machine can fetch from), into $LLAMA_SERVER_DIR/bin/llama-server. The served benchmark's
# llama_server contender runs it with a slot per client (bench/served_peers.py). Only the
# benchmark uses it; neither `make test` nor CI builds it. About ten minutes on two cores.
set -euo pipefail

PACKAGE=${LLAMA_SERVER_PACKAGE:-llama-cpp-python==0.3.36}
DEST=${LLAMA_SERVER_DIR:-.llama-server}
PIP=${PIP:-.venv/bin/pip}

mkdir -p "$DEST/src" "$DEST/bin"
"$PIP" download --quiet --no-deps --no-binary :all: "$PACKAGE" -d "$DEST/src"
archive=$(ls "$DEST"/src/*.tar.gz | head -n 1)
tar xzf "$archive" -C "$DEST/src"
source_dir=$(ls -d "$DEST"/src/*/vendor/llama.cpp | head -n 1)

# Native code for this CPU, as conveyor's kernels are built; no web UI (it would be fetched
# from the internet), no HTTPS, no tests or examples.
cmake -S "$source_dir" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
cmake --build "$DEST/build" --target llama-server -j "$(nproc)"
cp "$DEST/build/bin/llama-server" "$DEST/bin/llama-server"
"$DEST/bin/llama-server" --version
