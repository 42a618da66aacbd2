#!/usr/bin/env bash
# Prints the directory holding the real coding agents the agent tests drive (tests/suite/agents.rs):
# Claude Code, Codex and Gemini CLI from the npm registry, at the exact versions below, installed
# into .agents/ (ignored by git) when absent or at other versions. Honours AGENTS_BIN.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
has_agents() { [ -x "$1/claude" ] && [ -x "$1/codex" ] && [ -x "$1/gemini" ]; }
if [ -n "${AGENTS_BIN:-}" ] && has_agents "$AGENTS_BIN"; then echo "$AGENTS_BIN"; exit 0; fi
# Claude Code's own postinstall links its native binary (from its platform package) into place.
bin=$("$root/scripts/npm-pinned.sh" "$root/.agents" \
  "@anthropic-ai/claude-code@2.1.332" "@openai/codex@0.171.0" "@google/gemini-cli@0.61.0")
has_agents "$bin" || { echo "agents install failed: $bin lacks claude, codex or gemini" >&2; exit 1; }
echo "$bin"
