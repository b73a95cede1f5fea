# Sourced by the bench/gpu scripts that run on the GPU machine (after `tar -xzf gpu-carry-z/carry.tgz`):
# C, the staged binaries and libraries (bench/gpu/stage.sh); OUT, where results go (the device tool's
# $OUT, else gpu-out); the library path the staged binaries need; INFERX_TESTDATA_DIR. find_ncu sets NCU to Nsight Compute's
# command line, or says it is missing and returns 1.
C="${C:-gpu-carry}"
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$C/gpu-libs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The GPU tests that read shared test data (stories260K.gguf, staged into $C by stage.sh) look here.
export INFERX_TESTDATA_DIR="${INFERX_TESTDATA_DIR:-$PWD/$C}"

find_ncu() {
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [[ -n "$NCU" ]] || { echo "ncu: not found"; return 1; }
}
