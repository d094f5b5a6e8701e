#!/usr/bin/env bash
# Builds and runs the benchmarks; the Markdown report goes to stdout.
#   bash scripts/bench.sh [--case big|many|all] [--repeat N] [--dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >&2
build_dir=${HOLDPOINT_BUILD_DIR:-build}
"$build_dir/bench/checkpoint_bench" "$@"
