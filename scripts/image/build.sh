#!/usr/bin/env bash
# `make image`: build the control-plane and agent images from the Dockerfile with Debian's
# buildah (`bud --isolation chroot`, no Docker daemon) on a local debootstrap base, reaching
# no network but the package registries (Debian for the base, PyPI inside the builds).
#
#   1. buildah and debootstrap: installed with apt-get when missing (as root), or the script
#      says exactly what is missing and stops;
#   2. the base: scripts/image/base.sh (a stand-in for python:3.11.11-slim-bookworm, cached);
#   3. the torch index: with TORCH_VARIANT=cpu and no TORCH_INDEX_URL, a PEP 503 simple index
#      on disk holding the local torch wheel ($TORCH_WHEEL_DIR) and its dependencies
#      (downloaded once from PyPI into $CACHE), bind-mounted into the build and named by a
#      file:// TORCH_INDEX_URL; other variants use the Dockerfile's default index
#      (download.pytorch.org) or TORCH_INDEX_URL;
#   4. `buildah bud --layers` of the targets control-plane and agent (layers cached, so a
#      re-run with unchanged sources takes seconds).
#
# The host's CA bundle ($CA_BUNDLE) is bind-mounted over the build containers' during RUN
# steps only (this machine's egress goes through a TLS-inspecting proxy); it is not in the
# images. Writes the build times to build/image/build.json. Environment: TAG, TORCH_VARIANT,
# TORCH_INDEX_URL, TORCH_WHEEL_DIR, CA_BUNDLE, CONTROL_PLANE_IMAGE, AGENT_IMAGE,
# TESSERA_IMAGE_CACHE.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
TAG="${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}"
TORCH_VARIANT="${TORCH_VARIANT:-cpu}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"
TORCH_WHEEL_DIR="${TORCH_WHEEL_DIR:-/opt/wheels}"
TORCH_VERSION=2.13.0
CA_BUNDLE="${CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
CACHE="${TESSERA_IMAGE_CACHE:-/var/cache/tessera-image}"
export TESSERA_IMAGE_CACHE="$CACHE"
CONTROL_PLANE_IMAGE="${CONTROL_PLANE_IMAGE:-localhost/tessera-control-plane:$TAG}"
if [ "$TORCH_VARIANT" = cpu ]; then agent_tag="$TAG"; else agent_tag="$TAG-$TORCH_VARIANT"; fi
AGENT_IMAGE="${AGENT_IMAGE:-localhost/tessera-agent:$agent_tag}"
PY="$(command -v python3)"

log() { echo "image: $*" >&2; }
die() { echo "image: $*" >&2; exit 1; }

# ---- 1. tools ----
"$ROOT/scripts/image/tools.sh"

# ---- 2. base ----
t0=$SECONDS
BASE_IMAGE="$("$ROOT/scripts/image/base.sh")"
base_s=$((SECONDS - t0))

# ---- 3. torch index ----
volumes=()
if [ -z "$TORCH_INDEX_URL" ] && [ "$TORCH_VARIANT" = cpu ]; then
  shopt -s nullglob
  wheels=("$TORCH_WHEEL_DIR"/torch-"$TORCH_VERSION"+cpu-*.whl)
  shopt -u nullglob
  [ "${#wheels[@]}" -gt 0 ] || die "no torch-$TORCH_VERSION+cpu wheel in $TORCH_WHEEL_DIR;" \
    "set TORCH_WHEEL_DIR, or TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"
  wheel="${wheels[0]}"
  name="$(basename "$wheel" .whl)"
  index="$CACHE/torch-index/$name"
  if [ ! -f "$index/simple/torch/index.html" ]; then
    log "local torch index: $name and its dependencies from PyPI -> $index"
    rm -rf "$index.part" && mkdir -p "$index.part/files"
    cp "$wheel" "$index.part/files/"
    "$PY" -m pip download --quiet --only-binary=:all: --dest "$index.part/files" "$wheel" >&2
    "$PY" - "$index.part" <<'PY'
import hashlib, html, pathlib, re, sys
root = pathlib.Path(sys.argv[1])
projects: dict[str, list[pathlib.Path]] = {}
for f in sorted((root / "files").iterdir()):
    name = re.sub(r"[-_.]+", "-", f.name.split("-")[0]).lower()
    projects.setdefault(name, []).append(f)
for name, files in projects.items():
    links = "".join(
        f'<a href="../../files/{html.escape(f.name)}#sha256='
        f'{hashlib.sha256(f.read_bytes()).hexdigest()}">{html.escape(f.name)}</a>\n'
        for f in files
    )
    (root / "simple" / name).mkdir(parents=True)
    (root / "simple" / name / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
PY
    mv "$index.part" "$index"
  fi
  # A PEP 503 index on disk, bind-mounted into the build's RUN steps (never into the image).
  # The URL names the wheel, so the torch layer's cache key changes exactly when it does.
  volumes+=(--volume "$index:/run/torch-index/${name//+/_}:ro")
  TORCH_INDEX_URL="file:///run/torch-index/${name//+/_}/simple"
  log "torch index: $TORCH_INDEX_URL"
fi

# ---- 4. the images ----
bud=(buildah bud --isolation chroot --network host --layers --pull=never
     --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --file Dockerfile)
[ -z "$CA_BUNDLE" ] || [ ! -f "$CA_BUNDLE" ] ||
  bud+=(--volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro")
bud+=("${volumes[@]}")

log "building $CONTROL_PLANE_IMAGE (target control-plane)"
t0=$SECONDS
"${bud[@]}" --target control-plane --tag "$CONTROL_PLANE_IMAGE" . >&2
control_plane_s=$((SECONDS - t0))

log "building $AGENT_IMAGE (target agent, torch $TORCH_VARIANT)"
agent_args=(--build-arg "TORCH_VARIANT=$TORCH_VARIANT")
[ -z "$TORCH_INDEX_URL" ] || agent_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
t0=$SECONDS
"${bud[@]}" "${agent_args[@]}" --target agent --tag "$AGENT_IMAGE" . >&2
agent_s=$((SECONDS - t0))

mkdir -p build/image
cat > build/image/build.json <<JSON
{"date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "base_image": "$BASE_IMAGE", "base_s": $base_s,
 "control_plane_image": "$CONTROL_PLANE_IMAGE", "control_plane_s": $control_plane_s,
 "agent_image": "$AGENT_IMAGE", "agent_s": $agent_s, "torch_variant": "$TORCH_VARIANT"}
JSON
log "built in ${base_s}s (base) + ${control_plane_s}s (control plane) + ${agent_s}s (agent)"
buildah images --format "{{.Name}}:{{.Tag}} {{.Size}}" | grep -E "tessera-(control-plane|agent|base)" >&2 || true
