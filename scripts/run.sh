#!/usr/bin/env bash
# The README's run command: Neovim (0.11.4 from PyPI when no Neovim >= 0.10 is installed) with
# the plugin from this checkout, a clean config, and the freshly built backend.
# Try: :AgentBash ls -la
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvim=$("$root/scripts/nvim.sh")
exec "$nvim" --clean --cmd "set rtp^=$root" "$@"
