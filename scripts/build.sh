#!/usr/bin/env bash
# Installs what is missing, then configures and builds holdpoint.
#   bash scripts/build.sh [--target NAME]... [-- CMAKE_ARGS...]
# Without --target, everything is built.
#   HOLDPOINT_LIBTORCH    wheel (default): LibTorch 2.13 from the pinned torch
#                         wheel in .venv, built in build/;
#                         debian: Debian's libtorch-dev (1.13 on Debian 12,
#                         2.x on 13), built in build-debian/
#   HOLDPOINT_BUILD_DIR   build directory (default: as above)
#   HOLDPOINT_JOBS        parallel compile jobs (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."

targets=()
cmake_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target) targets+=(--target "$2"); shift 2 ;;
    --) shift; cmake_args+=("$@"); break ;;
    *) cmake_args+=("$1"); shift ;;
  esac
done

bash scripts/install-deps.sh
venv=${HOLDPOINT_VENV:-.venv}
python=$(cd "$venv/bin" && pwd)/python
libtorch=${HOLDPOINT_LIBTORCH:-wheel}
case "$libtorch" in
  wheel)
    build_dir=${HOLDPOINT_BUILD_DIR:-build}
    # The wheel's package directory holds lib/ and include/; share/cmake holds
    # TorchConfig.cmake. Both go first in the prefix path so that a
    # libtorch-dev installed beside it is never picked up instead.
    torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
    cmake_args=("-DCMAKE_PREFIX_PATH=$torch_dir;$torch_dir/share/cmake" "${cmake_args[@]}")
    ;;
  debian)
    build_dir=${HOLDPOINT_BUILD_DIR:-build-debian}
    cmake_args=(-DHOLDPOINT_BENCH=OFF "${cmake_args[@]}")
    ;;
  *)
    echo "build.sh: HOLDPOINT_LIBTORCH must be wheel or debian, not '$libtorch'" >&2
    exit 2
    ;;
esac
jobs=${HOLDPOINT_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DHOLDPOINT_ORACLE_PYTHON=$python" "${cmake_args[@]}"
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
