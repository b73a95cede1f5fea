#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install dependencies, build the CPU engine and run it on the
# small trained model in ../shared/testdata. Extra arguments are passed to `inferx generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu --target inferx
model="${INFERX_MODEL:-../shared/testdata/stories260K.gguf}"
if [ $# -eq 0 ]; then
  set -- --prompt "Once upon a time" -n 128
fi
exec build/cpu/src/cli/inferx generate --model "$model" "$@"
