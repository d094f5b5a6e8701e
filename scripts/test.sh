#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (CI runs this):
#   1. the primary configuration, LibTorch 2.13 from the pinned wheel (build/):
#      unit, interop (Python torch 2.13 as the oracle; Debian's torch 1.13 for
#      the 1.13-compatible mode where installed), corpus, fuzz-corpus replay,
#      the installed-package consumer test and the Python package's tests
#      (ctest); then the Python package built as a wheel by scikit-build-core,
#      installed into the venv and run from outside the tree;
#   2. the second configuration, Debian's libtorch-dev (build-debian/): the
#      libraries and every unit and fuzz-replay test;
#   3. a short libFuzzer run of every parser under ASan+UBSan (clang, build-fuzz/).
# Opt-in long tier: HOLDPOINT_LARGE_TESTS=1 (>4 GiB zip64 records, 65k-record
# torch.save differential, 300 SIGKILL cycles instead of 32) and
# HOLDPOINT_FUZZ_SECONDS=<n> (longer fuzzing). HOLDPOINT_SKIP_DEBIAN=1 skips 2.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${HOLDPOINT_JOBS:-$(nproc)}
started=$SECONDS
stage() { echo "== $* ($(( (SECONDS - started) / 60 )) min so far)"; }

stage "1. LibTorch 2.13 (torch==2.13.0 wheel): build"
HOLDPOINT_LIBTORCH=wheel bash scripts/build.sh
build_dir=${HOLDPOINT_BUILD_DIR:-build}
stage "1. LibTorch 2.13: ctest (unit, python interop, corpus, fuzz corpus replay, consumer)"
ctest --test-dir "$build_dir" -j "$jobs" --output-on-failure --timeout 900

stage "1. the Python package: pip wheel (scikit-build-core), installed into the venv, run from elsewhere"
venv=${HOLDPOINT_VENV:-.venv}
rm -rf build-python/dist
"$venv/bin/pip" wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps -w build-python/dist .
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps build-python/dist/holdpoint-*.whl
source_dir=$PWD
(cd "$(mktemp -d)" && "$source_dir/$venv/bin/python" - "$source_dir" <<'PY'
import os, subprocess, sys
import holdpoint
source = sys.argv[1]
assert "site-packages" in holdpoint.__file__, holdpoint.__file__
rng = holdpoint.load(os.path.join(source, "tests/corpus/real_pt/hf_trainer_rng_state_2023-11.pth"))
assert rng["numpy"][0] == "MT19937" and rng["numpy"][1].shape == (624,)
try:
    holdpoint.load(os.path.join(source, "tests/corpus/malicious/modelscan__unsafe_zip_pytorch.pt"))
    raise SystemExit("a hostile file was accepted")
except holdpoint.Error as error:
    assert error.code == "pickle_global_forbidden", error.code
script = os.path.join(os.path.dirname(sys.executable), "holdpoint")
out = subprocess.run([script, "verify", os.path.join(source, "tests/corpus/real_pt/hf_trainer_rng_state_2023-11.pth")],
                     capture_output=True, text=True)
assert out.returncode == 0 and out.stdout.startswith("valid: "), out
print("installed package and console script: ok")
PY
)

if [ "${HOLDPOINT_SKIP_DEBIAN:-0}" != 1 ]; then
  debian_dir=${HOLDPOINT_DEBIAN_BUILD_DIR:-build-debian}
  stage "2. Debian's libtorch-dev: build the libraries and the unit tests"
  HOLDPOINT_LIBTORCH=debian HOLDPOINT_BUILD_DIR="$debian_dir" \
    bash scripts/build.sh --target holdpoint_unit_tests
  stage "2. Debian's libtorch-dev: ctest -L unit"
  ctest --test-dir "$debian_dir" -L unit -j "$jobs" --output-on-failure --timeout 900
fi

stage "3. short fuzz run (clang libFuzzer, ASan+UBSan)"
fuzz_dir=${HOLDPOINT_FUZZ_BUILD_DIR:-build-fuzz}
cmake -S . -B "$fuzz_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DHOLDPOINT_FUZZ=ON -DHOLDPOINT_TESTS=OFF \
  -DHOLDPOINT_FUZZ_SECONDS="${HOLDPOINT_FUZZ_SECONDS:-30}"
cmake --build "$fuzz_dir" -j "$jobs"
# Each fuzzer is single-threaded: one per core.
ctest --test-dir "$fuzz_dir" -L fuzz -j "$jobs" --output-on-failure
stage "all tests passed"
