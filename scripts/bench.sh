#!/usr/bin/env bash
# The README's bench command: builds in release mode and prints every benchmark table
# (medians against baselines measured in the same run). Extra arguments pick sections.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --quiet --bench bench -- "$@"
