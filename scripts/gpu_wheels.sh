#!/usr/bin/env bash
# Builds the wheels folder `tessera bench gpu` needs beside a CUDA PyTorch on a machine
# with no network (docs/gpu.md). Run it where pip reaches PyPI; carry the folder over and
# install with:
#   python3 -m pip install --no-index --no-deps --target /tmp/site DIR/*.whl
#   export PYTHONPATH=/tmp/site:SRC/src:SRC/agent:SRC/operator
# Versions are the agent lock's (requirements/agent.lock). Only what a CUDA image with
# torch, transformers, safetensors, tokenizers, aiohttp, numpy, scipy, pyyaml, jinja2,
# prometheus-client, nvidia-ml-py and uvloop lacks is fetched; pass more names to add.
# Usage: scripts/gpu_wheels.sh DIR [PYTHON_VERSION] [EXTRA==VERSION ...]
set -euo pipefail
dir=${1:?usage: scripts/gpu_wheels.sh DIR [PYTHON_VERSION] [EXTRA==VERSION ...]}
py=${2:-3.12}
shift $(( $# > 1 ? 2 : 1 ))
lock="$(dirname "$0")/../requirements/agent.lock"
pin() { grep -E "^$1==" "$lock" | head -1 | cut -d' ' -f1; }
names=()
for n in grpcio grpcio-health-checking protobuf cryptography cffi pycparser; do
  p=$(pin "$n"); [ -n "$p" ] || { echo "no pin for $n in $lock" >&2; exit 1; }
  names+=("$p")
done
mkdir -p "$dir"
plats=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plats+=(--platform "$p")
done
python3 -m pip download --no-deps --only-binary=:all: --python-version "$py" \
  --implementation cp "${plats[@]}" -d "$dir" "${names[@]}" "$@"
ls -1 "$dir"
