#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server (llama-server, C++) from the llama.cpp tree vendored in the
# pinned llama-cpp-python sdist, for the server load test (peer_protocol.py server). Prints the
# binary's path. Native CPU flags (AVX-512 etc. where present), no curl, no web UI downloads.
#   LLAMA_SERVER=$(tools/bench/build_llama_server.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SRC=$("$ROOT/tools/bench/fetch_llama_cpp_src.sh")
BUILD=${BUILD:-$ROOT/bench-models/llama-server-build}
CMAKE=${CMAKE:-$ROOT/tools/.venv/bin/cmake}
if [ ! -x "$BUILD/bin/llama-server" ]; then
  "$CMAKE" -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
  "$CMAKE" --build "$BUILD" --target llama-server -j "$(nproc)" >&2
fi
echo "$BUILD/bin/llama-server"
