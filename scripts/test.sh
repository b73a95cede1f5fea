#!/usr/bin/env bash
# Builds everything and runs every test on a fresh Debian 12 machine (this is what CI runs):
#  1. the CUDA backend and the NCCL collectives compile (when nvcc is installed; nothing runs them here),
#  2. each parser of outside input is fuzzed briefly with libFuzzer (GGUF with its tokenizer, safetensors,
#     config.json, tokenizer.json, byte-level and SentencePiece encoding, chat templates, OpenAI requests, a
#     checkpoint's quantization plan; UBSan findings are fatal there too),
#  3. unit tests under AddressSanitizer + UndefinedBehaviorSanitizer,
#  4. the full Release test suite (ctest),
#  5. Python tests (pytest, pinned tools in tests/requirements.txt): end-to-end tests of the real server
#     and conformance tests against the reference Python libraries; pytest's summary is the last line.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
  echo "== CUDA backend: compile only"
  cmake --preset cuda >/dev/null
  cmake --build --preset cuda --target inferx_backend_cuda inferx_parallel_nccl -j "$jobs"
fi

echo "== fuzzing the parsers (${INFERX_FUZZ_SECONDS:-30}s each)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$jobs" --target fuzzers
for f in build/fuzz/fuzz/fuzz_*; do
  [ -x "$f" ] || continue
  name=$(basename "$f")
  mkdir -p "build/fuzz/corpus/$name"
  seeds="fuzz/seeds/${name#fuzz_}"
  [ -d "$seeds" ] || seeds=""
  "$f" -max_total_time="${INFERX_FUZZ_SECONDS:-30}" -rss_limit_mb=2048 -max_len=65536 \
    "build/fuzz/corpus/$name" $seeds >"build/fuzz/$name.log" 2>&1 || { tail -50 "build/fuzz/$name.log"; exit 1; }
  tail -1 "build/fuzz/$name.log"
done

echo "== unit tests under ASan + UBSan"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs" --no-tests=error >build/asan/ctest.log 2>&1 || { cat build/asan/ctest.log; exit 1; }
tail -3 build/asan/ctest.log

echo "== full test suite (Release)"
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$jobs"
# ctest ends with a timing line; drop it so that the pass/fail summary is the last line printed.
ctest --preset cpu -j "$jobs" --no-tests=error 2>&1 | grep -v -e '^Total Test time' -e '^$'

if compgen -G "tests/e2e/test_*.py" >/dev/null || compgen -G "tests/python/test_*.py" >/dev/null; then
  echo "== Python tests (pytest)"
  if [ ! -x build/venv/bin/pytest ] || ! cmp -s tests/requirements.txt build/venv/requirements.txt; then
    /usr/bin/python3 -m venv build/venv
    build/venv/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
    cp tests/requirements.txt build/venv/requirements.txt
  fi
  INFERX_BIN="$PWD/build/cpu/src/cli/inferx" build/venv/bin/pytest -q -p no:cacheprovider tests/
fi
