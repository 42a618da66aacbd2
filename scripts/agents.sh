#!/usr/bin/env bash
# Prints the directory holding the real coding agents the agent tests drive (tests/suite/agents.rs):
# Claude Code, Codex and Gemini CLI from the npm registry, at the exact versions below, installed
# into .agents/ (ignored by git) when absent or at other versions. Honours AGENTS_BIN.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pins=("@anthropic-ai/claude-code@2.1.332" "@openai/codex@0.171.0" "@google/gemini-cli@0.61.0")
dir="$root/.agents"
installed() {
  local d=$1 pin name version
  for pin in "${pins[@]}"; do
    name=${pin%@*} version=${pin##*@}
    [ -f "$d/../$name/package.json" ] || return 1
    grep -q "\"version\": \"$version\"" "$d/../$name/package.json" || return 1
  done
  [ -x "$d/claude" ] && [ -x "$d/codex" ] && [ -x "$d/gemini" ]
}
if [ -n "${AGENTS_BIN:-}" ] && installed "$AGENTS_BIN"; then echo "$AGENTS_BIN"; exit 0; fi
bin="$dir/node_modules/.bin"
if installed "$bin"; then echo "$bin"; exit 0; fi
command -v npm >/dev/null 2>&1 || "$root/scripts/debian-tool.sh" /usr/bin/npm npm >&2
echo "installing ${pins[*]} into $dir (npm)" >&2
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"private": true}' >"$dir/package.json"
# Claude Code's own postinstall links its native binary (from its platform package) into place.
(cd "$dir" && npm install --no-audit --no-fund --loglevel=error --save-exact "${pins[@]}" >&2)
installed "$bin" || { echo "agents install failed: $bin lacks claude, codex or gemini" >&2; exit 1; }
echo "$bin"
