#!/usr/bin/env bash
# The main job, end to end: installs what building, recording and
# analyzing need (not the test-only tools: scripts/test.sh adds those),
# builds memleak and the fixtures, records the bundled `seed` fixture, and
# writes the report and the flamegraph under target/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
scripts/setup.sh --demo
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

cargo build --release --bin memleak
make -C fixtures OUT="$ROOT/target/fixtures" "$ROOT/target/fixtures/seed"
mkdir -p target/demo

MEMLEAK=target/release/memleak
TRACE=target/demo/trace.parquet
$MEMLEAK record -o "$TRACE" --force -- target/fixtures/seed
$MEMLEAK info "$TRACE"
$MEMLEAK analyze "$TRACE"
$MEMLEAK analyze "$TRACE" --format svg -o target/demo/flamegraph.svg
$MEMLEAK analyze "$TRACE" --format json -o target/demo/report.json
echo
echo "demo: trace in $TRACE, report in target/demo/report.json, flamegraph in target/demo/flamegraph.svg"
