#!/usr/bin/env bash
# Prints the first Python 3 interpreter that can import numpy: `python3` on the PATH, else Debian's /usr/bin/python3
# (a pyenv or venv python3 may come first on the PATH without numpy, while scripts/install-deps.sh installs
# python3-numpy for Debian's). Exits 1, printing nothing, when neither can. Used by scripts/install-deps.sh and by the
# tests that run scripts/exl2_check.py.
for py in python3 /usr/bin/python3; do
  if command -v "$py" > /dev/null 2>&1 && "$py" -c 'import numpy' > /dev/null 2>&1; then
    echo "$py"
    exit 0
  fi
done
exit 1
