#!/usr/bin/env bash
# Installs the Debian 12 packages InferX builds and tests with. Safe to run again: it skips apt when
# everything is already there.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config git
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-14 libclang-rt-14-dev clang-format
  python3 python3-venv python3-pip
  libboost-dev prometheus
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
