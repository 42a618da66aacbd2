#!/usr/bin/env bash
# Prints the path of the `mcp-hub` program that mcphub.nvim starts (the Node server between
# Neovim and the MCP servers of its servers.json), for the mcphub test (tests/suite/mcp.rs).
# Installs mcp-hub at the exact version below from the npm registry into .mcp-hub/ (ignored by
# git) when absent. Honours MCP_HUB_BIN. mcphub.nvim and plenary.nvim themselves are read from
# the tarballs in ../shared/clients/ (MCP_HUB_CLIENTS) by the test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pin="mcp-hub@4.2.1"
version=${pin##*@}
dir="$root/.mcp-hub"
installed() {
  [ -x "$1" ] && grep -q "\"version\": \"$version\"" "$(dirname "$1")/../mcp-hub/package.json" 2>/dev/null
}
if [ -n "${MCP_HUB_BIN:-}" ] && [ -x "$MCP_HUB_BIN" ]; then echo "$MCP_HUB_BIN"; exit 0; fi
bin="$dir/node_modules/.bin/mcp-hub"
if installed "$bin"; then echo "$bin"; exit 0; fi
command -v npm >/dev/null 2>&1 || "$root/scripts/debian-tool.sh" /usr/bin/npm npm >&2
echo "installing $pin into $dir (npm)" >&2
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"private": true}' >"$dir/package.json"
(cd "$dir" && npm install --no-audit --no-fund --loglevel=error --save-exact "$pin" >&2)
installed "$bin" || { echo "mcp-hub install failed: no $bin at $version" >&2; exit 1; }
echo "$bin"
