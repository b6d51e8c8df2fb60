#!/usr/bin/env bash
# Fuzzes the trace reader and the analyzer's page decoder for SECONDS
# (default 60), then the recorder's drain of the agent's ring for half as
# long, with cargo-fuzz, from the committed corpora. New inputs go to
# a temporary directory; a crash leaves its input in fuzz/artifacts/ and
# fails the run. See fuzz/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
secs=${1:-60}
# cargo fuzz passes -Z flags (sanitizers); the machine has a stable
# toolchain only, which accepts them with RUSTC_BOOTSTRAP.
export RUSTC_BOOTSTRAP=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd fuzz
cargo fuzz run -O trace_reader "$work" corpus/trace_reader -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
mkdir -p "$work/ring"
cargo fuzz run -O ring_consumer "$work/ring" corpus/ring_consumer -- \
    -max_total_time="$(( (secs + 1) / 2 ))" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
