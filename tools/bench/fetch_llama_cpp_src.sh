#!/usr/bin/env bash
# Print the path of the llama.cpp source tree inside the pinned llama-cpp-python sdist
# (convert_hf_to_gguf.py, conversion/, gguf-py/), downloading and extracting it once.
#   SRC=$(tools/bench/fetch_llama_cpp_src.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/tools/.venv/bin/python}
VER=$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' "$ROOT/tools/bench/requirements.txt")
DEST=${DEST:-$ROOT/bench-models/llama-cpp-src}
SRC=$DEST/llama_cpp_python-$VER/vendor/llama.cpp
if [ ! -f "$SRC/convert_hf_to_gguf.py" ]; then
  mkdir -p "$DEST"
  # --no-build-isolation: pip prepares the sdist's metadata with the scikit-build-core
  # already in the venv (requirements.txt) instead of fetching a private copy.
  "$PY" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
    "llama-cpp-python==$VER" -d "$DEST" >&2
  tar xzf "$DEST/llama_cpp_python-$VER.tar.gz" -C "$DEST"
fi
echo "$SRC"
