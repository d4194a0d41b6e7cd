#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 60 s each; first argument overrides).
#
# Stable toolchain on purpose: CI has no other toolchain, and cargo-fuzz passes a few -Z flags, so
# RUSTC_BOOTSTRAP=1 lets stable rustc take them. `-s none`: the fuzzed code is safe Rust, where
# AddressSanitizer finds little that a panic check does not, and dropping it makes the build ~3x
# cheaper (CI runs on 2 cores). `--dev`: unoptimised, debug assertions and overflow checks on;
# the build is the cost that matters for a 60 s smoke. A crash fails the run and leaves the input
# in fuzz/artifacts/<target>/ (replay: cargo fuzz run --dev -s none <target> <file>).
set -euo pipefail
secs="${1:-60}"
cd "$(dirname "$0")"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
for target in http_parse record_decode node_frame; do
    echo "fuzz: $target for ${secs}s"
    cargo fuzz run --dev -s none "$target" -- -max_total_time="$secs" -rss_limit_mb=2048
done
