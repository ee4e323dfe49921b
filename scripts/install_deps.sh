#!/usr/bin/env bash
# Installs Shoal's build and test dependencies from Debian 12 packages (as root).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
# dpkg-dev: dpkg-shlibdeps for the Debian package (cpack -G DEB, tests/install).
pkgs=(build-essential cmake pkg-config dpkg-dev catch2 libfabric-dev libfabric-bin libhwloc-dev
      libopenmpi-dev openmpi-bin libbenchmark-dev iproute2 python3 clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
