#!/usr/bin/env bash
# The main job, end to end on a fresh machine: install, build, then prove
# that a training run resumes exactly (the resume-verification protocol:
# continuous, interrupted, resumed and resumed-without-RNG runs as fresh
# processes, compared step by step; also for the 2-rank data-parallel
# example with sharded checkpoints), classify the ways a "best" state is
# captured, and write, inspect and verify a checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo runs is built (target holdpoint_demo: the CLI and the
# examples below; not the tests, fuzz replays or benchmarks).
bash scripts/build.sh --target holdpoint_demo
build_dir=${HOLDPOINT_BUILD_DIR:-build}
out=$(mktemp -d "${TMPDIR:-/tmp}/holdpoint-demo.XXXXXX")
echo
echo "== 1. resume verification: examples/resume-protocol/train, cut at step 5 of 10 (mid-epoch)"
"$build_dir/holdpoint" verify-resume --trainer "$build_dir/examples/resume-protocol/train" \
  --steps 10 --cut 5 --output "$out/verification"
echo "   evidence: $out/verification/verification.json, picture: $out/verification/report.svg"
if [[ -x "$build_dir/examples/ddp/train" ]]; then
  echo
  echo "== 1b. the same proof for data-parallel training: examples/ddp/train on 2 ranks (Gloo), sharded checkpoints"
  "$build_dir/holdpoint" verify-resume --trainer "$build_dir/examples/ddp/train" \
    --trainer-arg --world --trainer-arg 2 --trainer-arg --save-every --trainer-arg 2 \
    --steps 8 --cut 3 --output "$out/verification-ddp"
  echo "   evidence: $out/verification-ddp/verification.json"
fi
echo
echo "== 2. best-state capture: which capture routes still hold the selected state"
"$build_dir/examples/best-state/capture_routes" --dir "$out/best-state" --json "$out/best-state.json"
echo
echo "== 3. save a small LibTorch model (conv + batch norm + linear) with a sha256sum sidecar"
"$build_dir/examples/save_small_model" "$out/model.pt"
echo
echo "== 4. holdpoint inspect (never executes the pickle)"
"$build_dir/holdpoint" inspect "$out/model.pt"
echo
echo "== 5. holdpoint verify against the sidecar, and with sha256sum itself"
"$build_dir/holdpoint" verify "$out/model.pt" --sidecar
(cd "$out" && sha256sum -c model.pt.sha256)
echo
echo "== 6. a tampered copy is rejected with a specific code"
cp "$out/model.pt" "$out/tampered.pt"
printf '\x01' | dd of="$out/tampered.pt" bs=1 seek=200 conv=notrunc status=none
if "$build_dir/holdpoint" verify "$out/tampered.pt"; then
  echo "demo failed: the tampered file was accepted" >&2
  exit 1
fi
echo
echo "demo files are in $out"
