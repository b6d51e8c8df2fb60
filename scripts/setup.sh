#!/usr/bin/env bash
# Installs what memleak needs on a fresh Debian 12 machine as root. Safe to
# run again: it only adds what is missing.
#
#   scripts/setup.sh           everything: build, record, and run the tests
#   scripts/setup.sh --demo    only what building, recording and analyzing
#                              need (scripts/demo.sh): no test-only tools
#   ... --list                 print the packages and tools of that set, and
#                              install nothing
set -euo pipefail

demo=0
list=0
for arg in "$@"; do
    case "$arg" in
    --demo) demo=1 ;;
    --list) list=1 ;;
    *) echo "setup: error: unknown option $arg (use --demo, --list)" >&2; exit 2 ;;
    esac
done

# Building memleak (the BPF programs with clang) and running it.
APT_PACKAGES=(
    clang llvm libelf-dev zlib1g-dev pkg-config make gcc g++ # build + BPF, the fixtures
    ca-certificates curl git
)
# What only the tests use.
TEST_PACKAGES=(
    valgrind gdb libjemalloc2                                # fixture cross-checks, -O test
    sqlite3 xz-utils                                         # programs of the valgrind comparison test
    python3 python3-pip python3-venv                         # DuckDB/pyarrow reader test
    linux-perf bpftool                                       # handy for debugging probes
    golang-go protobuf-compiler                              # pprof export test (go tool pprof, protoc)
    chromium                                                 # HTML report test (headless)
    openjdk-17-jre-headless                                  # Spark (memleak sql test)
    musl-tools                                               # musl programs (tests/musl.rs: musl-gcc)
)
if [ "$demo" -eq 0 ]; then
    APT_PACKAGES+=("${TEST_PACKAGES[@]}")
fi
if [ "$list" -eq 1 ]; then
    echo "apt: ${APT_PACKAGES[*]}"
    if [ "$demo" -eq 0 ]; then
        echo "python: duckdb pyarrow protobuf; pyspark (in /opt/memleak-spark)"
        echo "cargo: cargo-fuzz clippy rustfmt"
    fi
    exit 0
fi

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    as_root apt-get update -qq
    # Optional packages may not exist on every release; install what exists.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
        || for p in "${missing[@]}"; do
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" \
                || echo "setup: warning: could not install $p" >&2
        done
fi

# Python modules of the external-reader test. The python3 on PATH may be
# Debian's (PEP 668 "externally managed") or a pyenv/venv one.
if [ "$demo" -eq 0 ] && ! python3 -c 'import duckdb, pyarrow, google.protobuf' 2>/dev/null; then
    echo "setup: installing duckdb, pyarrow and protobuf for $(command -v python3)"
    python3 -m pip install --quiet duckdb pyarrow protobuf 2>/dev/null \
        || python3 -m pip install --quiet --break-system-packages duckdb pyarrow protobuf
fi
[ "$demo" -eq 1 ] || python3 -c 'import duckdb, pyarrow, google.protobuf' # fail loudly if still missing

# Spark in local mode for the `memleak sql` test (tests/fleet_sql.rs):
# PyPI's pyspark in a venv of its own, next to Debian's Java 17.
SPARK_VENV=/opt/memleak-spark
if [ "$demo" -eq 0 ] && ! "$SPARK_VENV/bin/python" -c 'import pyspark' 2>/dev/null; then
    echo "setup: installing pyspark into $SPARK_VENV"
    as_root python3 -m venv "$SPARK_VENV"
    as_root "$SPARK_VENV/bin/pip" install --quiet pyspark
fi
[ "$demo" -eq 1 ] || "$SPARK_VENV/bin/python" -c 'import pyspark' # fail loudly if still missing

# Rust: rustup is expected; install the toolchain pieces the scripts use.
if ! command -v cargo >/dev/null; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
    echo "setup: error: cargo not found; install Rust with rustup (https://rustup.rs) and rerun" >&2
    exit 1
fi
if [ "$demo" -eq 0 ] && command -v rustup >/dev/null; then
    rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt || true
fi

# cargo-fuzz, for scripts/fuzz.sh (the test suite fuzzes the reader).
if [ "$demo" -eq 0 ] && ! command -v cargo-fuzz >/dev/null; then
    echo "setup: installing cargo-fuzz"
    cargo install --quiet --locked cargo-fuzz
fi

# BPF needs tracefs (uprobes) and debugfs; mount them if they are not.
if [ "$(id -u)" -eq 0 ]; then
    if [ -d /sys/kernel/tracing ] && [ -z "$(ls -A /sys/kernel/tracing 2>/dev/null)" ]; then
        mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || echo "setup: warning: cannot mount tracefs" >&2
    fi
    if [ -d /sys/kernel/debug ] && [ -z "$(ls -A /sys/kernel/debug 2>/dev/null)" ]; then
        mount -t debugfs nodev /sys/kernel/debug 2>/dev/null || echo "setup: warning: cannot mount debugfs" >&2
    fi
fi
echo "setup: ok"
