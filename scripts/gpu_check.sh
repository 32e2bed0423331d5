#!/usr/bin/env bash
# Runs `tessera bench gpu --json` from a source folder on a GPU machine with no network
# (docs/gpu.md): installs the wheels that scripts/gpu_wheels.sh fetched (WHEELS, default
# ../.whl beside this folder's parent) into /tmp/site, puts the sources on PYTHONPATH and
# writes the JSON to $OUT/gpu.json (stderr to $OUT/gpu.err). Arguments go to the bench.
# Layout expected: SRC/{src,agent,operator} with this script at SRC/run.sh or
# SRC/scripts/gpu_check.sh.
R=$(cd "$(dirname "$0")" && pwd)
[ -d "$R/src" ] || R=$(cd "$R/.." && pwd)
OUTDIR=${OUT:-/tmp/gpu-out}
WHEELS=${WHEELS:-$R/../.whl}
mkdir -p "$OUTDIR"
if ls "$WHEELS"/*.whl >/dev/null 2>&1 && [ -z "${NO_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$R/src:$R/agent:$R/operator PYTHONUNBUFFERED=1
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
$PY -c "import torch, transformers, grpc, google.protobuf as p; print(torch.__version__, transformers.__version__, grpc.__version__, p.__version__)"
cd "$R" || exit 1
timeout "${BENCH_TIMEOUT:-390}" $PY -m tessera.cli.main bench gpu --json "$@" \
  >"$OUTDIR/gpu.json" 2>"$OUTDIR/gpu.err"
echo "rc=$?"
cat "$OUTDIR/gpu.json"
grep -v "Loading weights" "$OUTDIR/gpu.err" | tail -25
