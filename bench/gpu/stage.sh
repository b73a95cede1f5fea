#!/usr/bin/env bash
# Stages what bench/gpu/run.sh needs on the GPU machine into gpu-carry/ (ignored by git through
# .git/info/exclude): the CUDA build's binaries, the shared libraries the GPU image may lack, the
# shared GPU tools and the small trained model. Build first: cmake --preset cuda -DINFERX_NATIVE=OFF &&
# cmake --build build/cuda --target inferx test_cuda_backend bench_cuda_kernels test_cuda_qgemm
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/gpu-carry/' .git/info/exclude 2>/dev/null || echo '/gpu-carry/' >>.git/info/exclude
rm -rf gpu-carry && mkdir -p gpu-carry/gpu-libs
for b in build/cuda/src/cli/inferx build/cuda/tests/cuda/test_cuda_backend build/cuda/tests/cuda/bench_cuda_kernels; do
  cp "$b" gpu-carry/
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case "$name" in
      libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | libgcc_s.so* | libstdc++.so* | \
        libcudart.so* | libcublas.so* | libcublasLt.so* | libcuda.so* | libnccl.so*) ;; # the GPU image has these
      *) cp -L "$path" gpu-carry/gpu-libs/ ;;
    esac
  done
done
# The other GPU test binaries (engine, quantized GEMM, tensor parallel) and the collectives bench: same
# libraries as test_cuda_backend.
for t in test_cuda_engine test_cuda_qgemm test_cuda_tensor_parallel bench_collectives; do
  [[ -x build/cuda/tests/cuda/$t ]] && cp build/cuda/tests/cuda/$t gpu-carry/
done
# EXTRA_BINS="NAME=PATH ...": more binaries beside inferx, e.g. an older build for decode_ab.sh's BIN=NAME
# variants (copy build/cuda/src/cli/inferx aside before rebuilding).
for nb in ${EXTRA_BINS:-}; do cp "${nb#*=}" "gpu-carry/${nb%%=*}"; done
cp -r ../shared/tools gpu-carry/tools
# The CUPTI injection library of bench/gpu/timeline.sh and the CUPTI it links (the GPU image's toolkit may
# lack it): only where the build made it.
if [[ -f build/cuda/tests/cuda/libinferx_kernel_timeline.so ]]; then
  cp build/cuda/tests/cuda/libinferx_kernel_timeline.so gpu-carry/
  cp -L "$(ldd build/cuda/tests/cuda/libinferx_kernel_timeline.so | awk '/libcupti/ {print $3}')" gpu-carry/gpu-libs/
fi
cp ../shared/testdata/stories260K.gguf gpu-carry/
# The device call carries at most 64 MiB: strip the binaries (each holds the whole fatbin) and ship one
# tarball; there: `tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/run.sh`, carry ["gpu-carry-z"].
strip gpu-carry/inferx gpu-carry/test_cuda_* gpu-carry/bench_cuda_*
[[ -x gpu-carry/bench_collectives ]] && strip gpu-carry/bench_collectives
mkdir -p gpu-carry-z
tar -czf gpu-carry-z/carry.tgz gpu-carry
du -sh gpu-carry gpu-carry-z
