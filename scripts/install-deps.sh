#!/usr/bin/env bash
# Installs the Debian 12 packages tessera builds and tests with. Idempotent: packages already present are left
# alone and apt is not even called when nothing is missing. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config xz-utils
  libjansson-dev libpcre2-dev libutf8proc-dev libcmocka-dev libinih-dev
  libopenmpi-dev openmpi-bin libhwloc-dev hwloc-nox
  libnanomsg-dev libmicrohttpd-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# numpy: only for scripts/exl2_check.py (the cli.synth test); any numpy python3 can import will do
if ! python3 -c 'import numpy' >/dev/null 2>&1; then
  missing+=(python3-numpy)
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
