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

# numpy: only for scripts/exl2_check.py (the cli.synth tests); python3 or Debian's /usr/bin/python3 (python-numpy.sh)
if ! bash "$(dirname "$0")/python-numpy.sh" >/dev/null; then
  missing+=(python3-numpy)
fi

# curl and a Python venv: for the tessera serve tests (tests/serve/http), which drive the server with curl and
# the official openai package
command -v curl >/dev/null 2>&1 || missing+=(curl)
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# .cache/openai-venv: the openai client package from the package index (ignored by git). Without network this
# only warns; the tests that need it then report "skipped".
venv="$(cd "$(dirname "$0")/.." && pwd)/.cache/openai-venv"
if ! "$venv/bin/python" -c 'import openai' >/dev/null 2>&1; then
  echo "install-deps: creating $venv with the openai package" >&2
  if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check openai; } >&2; then
    echo "install-deps: warning: could not install the openai package (no network?); tests/serve/http will skip" >&2
  fi
fi
