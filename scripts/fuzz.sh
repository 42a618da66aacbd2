#!/usr/bin/env bash
# `make fuzz`: the full fuzzing campaign (tests/fuzz.rs), on stable Rust. Every target gets
# FUZZ_INPUTS inputs (default 1 000 000) from a seeded generator; a failure prints the input to
# add to the regressions in tests/fuzz.rs. FUZZ_SEED and FUZZ_TARGET are passed through.
set -euo pipefail
cd "$(dirname "$0")/.."
export FUZZ_INPUTS="${FUZZ_INPUTS:-1000000}"
exec cargo test --release --test fuzz
