#!/usr/bin/env bash
# The tools `make image` needs: buildah and debootstrap. Installs the missing ones with
# apt-get (after `apt-get update`) when run as root on a Debian/Ubuntu host; otherwise names
# what is missing and how to get it, and fails. Also fails when not root (buildah's chroot
# isolation and debootstrap need it). Called by scripts/image/build.sh.
set -euo pipefail

log() { echo "image-tools: $*" >&2; }
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing ${missing[*]} with apt-get"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >&2
  else
    log "missing: ${missing[*]}. Install them as root (apt-get install ${missing[*]} on" \
      "Debian/Ubuntu) and re-run; the build uses buildah's chroot isolation as root."
    exit 1
  fi
fi
[ "$(id -u)" = 0 ] || { log "run as root: buildah --isolation chroot and debootstrap need it"; exit 1; }
log "buildah $(buildah --version | awk '{print $3}'), debootstrap $(debootstrap --version | awk '{print $2}')"
