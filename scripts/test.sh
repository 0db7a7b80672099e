#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration and multi-process tests, the loom models of the
# ring, the ring under Miri, and the Python client's tests. Installs the Python packages the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}

if [ -s scripts/requirements.txt ]; then
    python3 -m pip install --quiet --disable-pip-version-check -r scripts/requirements.txt
fi

echo "== the python client, built from this tree"
# Installed first: the workspace tests run the examples' Python trainer too. The dev profile shares
# the dependencies of the workspace build.
MATURIN_PEP517_ARGS="--profile dev" python3 -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --force-reinstall --no-deps ./dataplane/python

echo "== workspace tests"
cargo test --workspace

echo "== the python client against a real AM and daemon"
SLUICE_BIN="$target/debug/sluice" python3 -m pytest -q dataplane/python/tests

echo "== loom models of the ring protocol"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$target/loom" \
    cargo test -p sluice-ring --test loom --release

echo "== the ring, the process identity and the local IO engine under Miri"
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    if rustup toolchain list | grep -q '^nightly'; then
        rustup component add --toolchain nightly miri rust-src || true
    else
        rustup toolchain install nightly --profile minimal --component miri,rust-src || true
    fi
fi
if cargo +nightly miri --version >/dev/null 2>&1; then
    MIRIFLAGS="-Zmiri-disable-isolation" CARGO_TARGET_DIR="$target/miri" \
        cargo +nightly miri test -p sluice-ring -p sluice-process -p sluice-io --lib
else
    echo "miri: SKIPPED: no nightly toolchain with the miri component could be installed" >&2
fi
