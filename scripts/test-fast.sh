#!/usr/bin/env bash
# The fast loop (README: `make test-fast`): a debug build, the unit tests, the Lua specs and the
# integration suites that run in seconds (no agents, no sshd, no Neovim-driven suites, no
# load tests). Under a minute on a warm build; `make test` stays the full CI run.
set -euo pipefail
cd "$(dirname "$0")/.."
NVIM_BIN=$(scripts/nvim.sh)
export NVIM_BIN
scripts/check-cycles.py
test_home=$(mktemp -d)
trap 'rm -rf "$test_home"' EXIT
export CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}" RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
HOME="$test_home" cargo test --quiet --lib --bins
HOME="$test_home" cargo test --quiet --test all -- \
  suite::pipeline suite::explain suite::rescue suite::wires suite::exec suite::receipt
for spec in tests/lua/*_spec.lua; do
  "$NVIM_BIN" --headless --clean -n -i NONE --cmd "set rtp^=$PWD" -l tests/lua/run.lua "$spec"
done
echo "== fast tests passed"
