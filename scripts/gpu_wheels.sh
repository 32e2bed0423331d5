#!/usr/bin/env bash
# Builds the wheels folder `tessera bench gpu` needs beside a CUDA PyTorch on a machine
# with no network (docs/gpu.md). Run it where pip reaches PyPI; carry the folder over and
# install with:
#   python3 -m pip install --no-index --no-deps --target /tmp/site DIR/*.whl
#   export PYTHONPATH=/tmp/site:SRC/src:SRC/agent:SRC/operator
# Versions are the agent lock's (requirements/agent.lock). Only what a CUDA image with
# torch, transformers, safetensors, tokenizers, aiohttp, numpy, scipy, pyyaml, jinja2,
# prometheus-client, nvidia-ml-py and uvloop lacks is fetched; pass more names to add.
# FLASHINFER=1 adds FlashInfer (the `gpu` extra: `--attention-backend flashinfer`, measured
# by `tessera bench gpu` under `attention`): flashinfer-python (FLASHINFER_VERSION, default
# the newest), what it needs beyond the image's torch (TORCH_VERSION, default 2.11.0;
# resolved with uv: UV, default the repository's .venv/bin/uv), and flashinfer-cubin of the
# same version when PyPI has it. Its attention kernels are compiled on first use (nvcc)
# unless a flashinfer-jit-cache wheel for the image's CUDA (flashinfer.ai/whl, not PyPI) is
# put in DIR too (docs/gpu.md).
# Usage: [FLASHINFER=1] scripts/gpu_wheels.sh DIR [PYTHON_VERSION] [EXTRA==VERSION ...]
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
if [ -n "${FLASHINFER:-}" ]; then
  uv=${UV:-"$(dirname "$0")/../.venv/bin/uv"}
  tmp=$(mktemp -d)
  torch_pin="torch==${TORCH_VERSION:-2.11.0}"
  printf '%s\n%s\n' "flashinfer-python${FLASHINFER_VERSION:+==$FLASHINFER_VERSION}" \
    "$torch_pin" >"$tmp/fi.in"
  echo "$torch_pin" >"$tmp/torch.in"
  for f in fi torch; do
    "$uv" pip compile --quiet --no-header --no-annotate --python-version "$py" \
      --python-platform x86_64-manylinux_2_28 "$tmp/$f.in" -o "$tmp/$f.txt"
  done
  # FlashInfer's closure less torch's (the image has torch and its CUDA libraries) and
  # less what the image has anyway.
  keep=$(comm -23 <(grep -E '^[A-Za-z]' "$tmp/fi.txt" | sort) \
    <(grep -E '^[A-Za-z]' "$tmp/torch.txt" | sort) |
    grep -viE '^(numpy|requests|packaging|tqdm|nvidia-ml-py|certifi|charset-normalizer|idna|urllib3|pyyaml|protobuf)==' || true)
  fiv=$(grep -E '^flashinfer-python==' "$tmp/fi.txt" | cut -d= -f3)
  echo "flashinfer-python $fiv and: $keep" >&2
  rm -rf "$tmp"
fi
plats=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plats+=(--platform "$p")
done
python3 -m pip download --no-deps --only-binary=:all: --python-version "$py" \
  --implementation cp "${plats[@]}" -d "$dir" "${names[@]}" "$@"
if [ -n "${FLASHINFER:-}" ]; then  # one at a time: a package without a wheel is named, not fatal
  for p in $keep "flashinfer-cubin==$fiv"; do
    python3 -m pip download --no-deps --only-binary=:all: --python-version "$py" \
      --implementation cp "${plats[@]}" --platform any -d "$dir" "$p" >/dev/null ||
      echo "gpu_wheels: no wheel of $p for Python $py (FlashInfer may miss it)" >&2
  done
fi
ls -1 "$dir"
