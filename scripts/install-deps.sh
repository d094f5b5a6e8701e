#!/usr/bin/env bash
# Installs what holdpoint needs, and only what is missing. Idempotent: a second
# run only checks. Works on Debian 12 and 13; needs root (or sudo) only when a
# Debian package is missing.
#
#  1. Debian packages: the toolchain, the libraries holdpoint links (OpenSSL,
#     ISA-L, nlohmann-json, CLI11, GoogleTest, the Python headers for the
#     Python package, ...), clang for the fuzzers, and
#     the second LibTorch configuration: libtorch-dev + libgloo-dev (LibTorch
#     1.13 on Debian 12, 2.x on 13) and python3-torch.
#  2. The primary configuration: a project-local virtual environment, .venv/
#     (HOLDPOINT_VENV overrides), with the pinned packages of
#     scripts/requirements.txt: torch 2.13.0 (CPU), whose wheel carries
#     LibTorch 2.13 for C++ and is the Python oracle of the interop tests.
#     torch is installed first and pinned, so nothing else can replace it.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config time
  libtorch-dev libgloo-dev
  libssl-dev zlib1g-dev libisal-dev libxxhash-dev
  nlohmann-json3-dev libcli11-dev libpcg-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang
  python3-torch python3-venv python3-dev
)
# LibFuzzer and the sanitizer runtimes of the default clang.
# clang may not be installed yet: its absence must not stop the script (set -e).
clang_major=$( (clang --version 2>/dev/null || true) | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n 1)
if [ -z "$clang_major" ]; then
  case "$(cut -d. -f1 /etc/debian_version 2>/dev/null)" in
    12) clang_major=14 ;;
    *) clang_major=19 ;;
  esac
fi
packages+=("libclang-rt-${clang_major}-dev")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# ---- the virtual environment with the pinned torch --------------------------------
venv=${HOLDPOINT_VENV:-.venv}
torch_version=$(sed -n 's/^torch==\(.*\)$/\1/p' scripts/requirements.txt)
if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" - "$torch_version" scripts/requirements.txt <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
import torch
assert torch.__version__.split("+")[0] == sys.argv[1]
for line in open(sys.argv[2]):
    line = line.split("#")[0].strip()
    if line:
        name, pinned = line.split("==")
        assert version(name).split("+")[0] == pinned, name  # 2.13.0+cpu is 2.13.0
PY
  echo "install-deps: $venv has torch $torch_version and every pinned package"
  exit 0
fi

# The wheel is built for CPython 3.11.
python=${HOLDPOINT_PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      python=$candidate
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "install-deps: needs CPython 3.11 for the torch==$torch_version wheel (set HOLDPOINT_PYTHON)" >&2
  exit 1
fi
echo "install-deps: creating $venv with $python and scripts/requirements.txt"
"$python" -m venv "$venv"
pip_args=(--quiet --disable-pip-version-check)
# Where this machine keeps wheels on disk (the torch CPU wheel among them).
if [ -d /opt/wheels ]; then pip_args+=(--find-links /opt/wheels); fi
"$venv/bin/pip" install "${pip_args[@]}" "torch==$torch_version"
"$venv/bin/pip" install "${pip_args[@]}" -r scripts/requirements.txt
"$venv/bin/python" -c 'import torch; print("install-deps: torch", torch.__version__, "in", torch.__file__)'
