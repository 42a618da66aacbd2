#!/usr/bin/env bash
# Prints the path of the `mcp-hub` program that mcphub.nvim starts (the Node server between
# Neovim and the MCP servers of its servers.json), for the mcphub test (tests/suite/mcp.rs).
# Installs mcp-hub at the exact version below from the npm registry into .mcp-hub/ (ignored by
# git) when absent. Honours MCP_HUB_BIN. mcphub.nvim and plenary.nvim themselves are read from
# the tarballs in ../shared/clients/ (MCP_HUB_CLIENTS) by the test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${MCP_HUB_BIN:-}" ] && [ -x "$MCP_HUB_BIN" ]; then echo "$MCP_HUB_BIN"; exit 0; fi
bin=$("$root/scripts/npm-pinned.sh" "$root/.mcp-hub" "mcp-hub@4.2.1")/mcp-hub
[ -x "$bin" ] || { echo "mcp-hub install failed: no $bin" >&2; exit 1; }
echo "$bin"
