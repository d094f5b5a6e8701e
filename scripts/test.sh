#!/usr/bin/env bash
# Installs missing packages, builds, and runs the whole test suite:
#   1. unit, interop (Python torch 1.13 oracle), corpus and fuzz-corpus replay tests (ctest);
#   2. a short libFuzzer run of every parser under ASan+UBSan (clang build in build-fuzz/).
# Opt-in long tier: HOLDPOINT_LARGE_TESTS=1 (>4 GiB zip64 records, 65k-record
# torch.save differential, 300 SIGKILL cycles instead of 32) and
# HOLDPOINT_FUZZ_SECONDS=<n> (longer fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build_dir=${HOLDPOINT_BUILD_DIR:-build}
jobs=${HOLDPOINT_JOBS:-$(nproc)}

echo "== ctest (unit, python interop, corpus, fuzz corpus replay)"
ctest --test-dir "$build_dir" -j "$jobs" --output-on-failure --timeout 900

echo "== short fuzz run (clang libFuzzer, ASan+UBSan)"
fuzz_dir=${HOLDPOINT_FUZZ_BUILD_DIR:-build-fuzz}
cmake -S . -B "$fuzz_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DHOLDPOINT_FUZZ=ON -DHOLDPOINT_TESTS=OFF \
  -DHOLDPOINT_FUZZ_SECONDS="${HOLDPOINT_FUZZ_SECONDS:-30}"
cmake --build "$fuzz_dir" -j "$jobs"
ctest --test-dir "$fuzz_dir" -L fuzz --output-on-failure
echo "== all tests passed"
