#!/usr/bin/env bash
# Prints the path of a Python that has the official MCP SDK (`mcp` on PyPI), the client the MCP
# tests drive `agent-bash mcp` with. Installs it into .venv/ when absent. Honours MCP_PYTHON.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
has_sdk() { "$1" -c 'import mcp, mcp.client.stdio, jsonschema, anyio' >/dev/null 2>&1; }
if [ -n "${MCP_PYTHON:-}" ] && has_sdk "$MCP_PYTHON"; then echo "$MCP_PYTHON"; exit 0; fi
py="$root/.venv/bin/python"
if [ -x "$py" ] && has_sdk "$py"; then echo "$py"; exit 0; fi
echo "installing the MCP Python SDK into $root/.venv (pip, mcp)" >&2
# The interpreter itself, not a version manager's shim (see scripts/nvim.sh).
[ -x "$py" ] || "$(python3 -c 'import sys; print(sys.executable)')" -m venv "$root/.venv" >&2
"$py" -m pip install --quiet --disable-pip-version-check 'mcp>=2.3,<3' jsonschema >&2
has_sdk "$py" || { echo "MCP SDK install failed: $py cannot import mcp" >&2; exit 1; }
echo "$py"
