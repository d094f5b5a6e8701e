#!/usr/bin/env bash
# Installs missing packages, then configures and builds holdpoint into build/.
#   HOLDPOINT_BUILD_DIR   build directory (default: build)
#   HOLDPOINT_JOBS        parallel compile jobs (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build_dir=${HOLDPOINT_BUILD_DIR:-build}
jobs=${HOLDPOINT_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build "$build_dir" -j "$jobs"
