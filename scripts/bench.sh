#!/usr/bin/env bash
# Builds and runs the benchmarks; the Markdown report goes to stdout.
#   bash scripts/bench.sh [floor] [--repeat N] [--mib M] [--dir DIR] [--no-peers] [--no-growth] [--no-big] [--quick]
#   bash scripts/bench.sh checkpoint [--case big|many|all] [--repeat N] [--dir DIR]
#   bash scripts/bench.sh publication [--mib N] [--repeat N] [--dir DIR] [--json FILE]
#   bash scripts/bench.sh distributed [--mib N] [--world W] [--repeat N] [--dir DIR] [--json FILE]
#   bash scripts/bench.sh distributed --load [--worlds 2,4,8] [--mib N] [--repeat N]  (per-rank reads)
#   bash scripts/bench.sh run_signing [--generations N] [--window W]
#     (what signing costs a commit as a run grows: bench/run_signing_bench.cpp)
#   bash scripts/bench.sh python [--repeat N] [--mib M] [--tensors N] [--dir DIR]
#     (the Python package against torch.load and safetensors: bench/python_load_bench.py)
#   bash scripts/bench.sh dcp [--worlds 2,4] [--cases big,many] [--repeat N] [--mib M] [--tensors N] [--cold]
#                             [--commit-worlds 2,4,8] [--no-compare] [--dir DIR] [--json FILE]
#     (holdpoint.dcp against stock torch.distributed.checkpoint on spawned Gloo ranks, and the
#      coordinator's commit cost by world size: bench/dcp_bench.py)
#   bash scripts/bench.sh resume [--sizes 32,128,256,512,1024] [--mib M] [--repeat N] [--dir DIR]
#     (resume in place against the private copy and max(read, SHA-256), fresh processes:
#      bench/resume_bench.cpp)
# Without a benchmark name the floor benchmark runs: every performance target
# (bench/RESULTS.md records a run) with its ratio and met / not met.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=floor
case "${1:-}" in
  floor|checkpoint|publication|distributed|python|run_signing|dcp|resume) bench=$1; shift ;;
esac
bash scripts/build.sh >&2
build_dir=${HOLDPOINT_BUILD_DIR:-build}
if [ "$bench" = python ]; then
  exec "${HOLDPOINT_VENV:-.venv}/bin/python" bench/python_load_bench.py --build-dir "$build_dir" "$@"
fi
if [ "$bench" = dcp ]; then
  exec "${HOLDPOINT_VENV:-.venv}/bin/python" bench/dcp_bench.py --build-dir "$build_dir" "$@"
fi
"$build_dir/bench/${bench}_bench" "$@"
