#!/usr/bin/env bash
# The main job, end to end on a fresh machine: install, build, then write a
# checkpoint from a small LibTorch model and inspect and verify it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build_dir=${HOLDPOINT_BUILD_DIR:-build}
out=$(mktemp -d "${TMPDIR:-/tmp}/holdpoint-demo.XXXXXX")
echo
echo "== 1. save a small LibTorch model (conv + batch norm + linear) with a sha256sum sidecar"
"$build_dir/examples/save_small_model" "$out/model.pt"
echo
echo "== 2. holdpoint inspect (never executes the pickle)"
"$build_dir/holdpoint" inspect "$out/model.pt"
echo
echo "== 3. holdpoint verify against the sidecar, and with sha256sum itself"
"$build_dir/holdpoint" verify "$out/model.pt" --sidecar
(cd "$out" && sha256sum -c model.pt.sha256)
echo
echo "== 4. a tampered copy is rejected with a specific code"
cp "$out/model.pt" "$out/tampered.pt"
printf '\x01' | dd of="$out/tampered.pt" bs=1 seek=200 conv=notrunc status=none
if "$build_dir/holdpoint" verify "$out/tampered.pt"; then
  echo "demo failed: the tampered file was accepted" >&2
  exit 1
fi
echo
echo "demo files are in $out"
