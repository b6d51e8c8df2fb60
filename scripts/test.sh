#!/usr/bin/env bash
# The whole test suite: installs what it needs, then runs every test.
# Release mode, because the end-to-end tests trace real programs and time
# matters to them; the tests build their own fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
# Tests that need root or a tool skip with a line where they cannot run,
# and count as passed. MEMLEAK_REQUIRE_ALL=1 makes them fail instead: .ci/run
# sets it, and so does any CI that sets CI (GitHub, GitLab and others do).
if [ -n "${CI:-}" ]; then
    export MEMLEAK_REQUIRE_ALL="${MEMLEAK_REQUIRE_ALL:-1}"
fi
scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo test --workspace --release
# The analyzer-only build (no clang, no libbpf) must keep building, and the
# code must pass the lints a reviewer runs.
cargo build --release --no-default-features
scripts/lint.sh
# The trace reader against damaged input, for a bounded time.
scripts/fuzz.sh "${MEMLEAK_FUZZ_SECONDS:-60}"
