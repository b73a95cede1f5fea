#!/usr/bin/env bash
# Runs test_cuda_backend (tests/cuda) on the GPU machine.
#
#   Here, after building (no GPU needed):  bench/gpu/run_cuda_tests.sh --pack [BUILD_DIR]
#       copies the binary's shared libraries that the GPU image may lack (libfmt, ...) into
#       BUILD_DIR/gpu-libs; CUDA, glibc and libstdc++ libraries are left to the GPU machine.
#   On the GPU machine (repository root):  bench/gpu/run_cuda_tests.sh [BUILD_DIR] [gtest flags...]
#       runs the tests; with $OUT set (the device tool) the XML report goes to $OUT/cuda_tests.xml.
#
# BUILD_DIR defaults to build/cuda (the `cuda` CMake preset). Exit status: the test binary's.
set -euo pipefail

pack=0
if [[ "${1:-}" == "--pack" ]]; then
  pack=1
  shift
fi
build="${1:-build/cuda}"
[[ $# -gt 0 ]] && shift
bin="$build/tests/cuda/test_cuda_backend"
if [[ ! -x "$bin" ]]; then
  echo "run_cuda_tests: $bin not found; build it first: cmake --build $build --target test_cuda_backend" >&2
  exit 2
fi

if [[ $pack == 1 ]]; then
  libs="$build/gpu-libs"
  mkdir -p "$libs"
  # "name => /path (addr)" lines of ldd; skip what every Linux or CUDA install provides.
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case "$name" in
      libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | libgcc_s.so* | libstdc++.so* | \
        libcudart.so* | libcublas.so* | libcublasLt.so* | libcuda.so*) ;;
      *) cp -L "$path" "$libs/$name" && echo "packed $name" ;;
    esac
  done
  echo "carry: $bin and $libs"
  exit 0
fi

export LD_LIBRARY_PATH="$PWD/$build/gpu-libs:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "== GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi failed"
echo "== CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) avx512f: $(grep -c -m1 avx512f /proc/cpuinfo || true)"
missing=$(ldd "$bin" | grep 'not found' || true)
if [[ -n "$missing" ]]; then
  echo "run_cuda_tests: missing shared libraries (run --pack here and carry $build/gpu-libs):" >&2
  echo "$missing" >&2
  exit 2
fi
args=(--gtest_color=no)
[[ -n "${OUT:-}" ]] && args+=("--gtest_output=xml:$OUT/cuda_tests.xml")
echo "== $bin"
export INFERX_REQUIRE_GPU=1  # a missing GPU fails the tests instead of skipping them
set +e
"$bin" "${args[@]}" "$@"
rc=$?
set -e
# 132 = SIGILL: the binary was built with -march=native for the build machine's CPU.
[[ $rc == 132 ]] && echo "run_cuda_tests: illegal instruction; rebuild with -DINFERX_NATIVE=OFF" >&2
exit $rc
