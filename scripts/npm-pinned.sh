#!/usr/bin/env bash
# Usage: npm-pinned.sh DIR NAME@VERSION... — installs the given npm packages at exactly those
# versions into DIR (ignored by git) unless each is already there at its version, and prints
# DIR/node_modules/.bin. The one npm install path of the test tools (scripts/agents.sh,
# scripts/mcp-hub.sh); npm itself comes from Debian when the machine has none.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$1
shift
installed() {
  local pin
  for pin in "$@"; do
    grep -q "\"version\": \"${pin##*@}\"" "$dir/node_modules/${pin%@*}/package.json" 2>/dev/null ||
      return 1
  done
}
if ! installed "$@"; then
  command -v npm >/dev/null 2>&1 || "$root/scripts/debian-tool.sh" /usr/bin/npm npm >&2
  echo "installing $* into $dir (npm)" >&2
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"private": true}' >"$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error --save-exact "$@" >&2)
  installed "$@" || { echo "npm install into $dir failed: $* not all there" >&2; exit 1; }
fi
echo "$dir/node_modules/.bin"
