# The README's commands. Each target is one line that calls cargo or a script.
.PHONY: build run test test-fast check bench lint fmt fuzz

build: ; cargo build --release
run: build ; scripts/run.sh $(ARGS)
test: ; scripts/test.sh
test-fast: ; scripts/test-fast.sh
check: ; scripts/check-cycles.py && cargo fmt --check && cargo clippy --all-targets --quiet -- -D warnings
bench: build ; scripts/bench.sh
fuzz: ; scripts/fuzz.sh
lint: ; cargo fmt --check && cargo clippy --release --all-targets -- -D warnings
fmt: ; cargo fmt
