#!/usr/bin/env bash
# Make the local stand-in for the Dockerfile's public base image, python:3.11.11-slim-bookworm,
# without a registry: a Debian bookworm root filesystem from debootstrap (--variant=minbase
# plus python3, python3-venv, ca-certificates, passwd), committed with buildah as the local
# image $BASE_IMAGE with the usual PATH and a `python` on it (the layout the Dockerfile uses).
#
# Cached twice: the debootstrap output as a tarball under $CACHE, keyed by the debootstrap
# arguments (a re-run after `buildah rmi`, or from another clone, skips debootstrap), and the
# committed image in buildah's storage, annotated with a hash of the whole recipe (a re-run
# that finds it does nothing).
# Called by scripts/image/build.sh (`make image`); prints the image name on stdout, logs on
# stderr. Needs root, debootstrap and buildah, and the Debian mirror $DEBIAN_MIRROR.
set -euo pipefail

BASE_IMAGE="${BASE_IMAGE:-localhost/tessera-base:bookworm}"
CACHE="${TESSERA_IMAGE_CACHE:-/var/cache/tessera-image}"
SUITE=bookworm
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3,python3-venv,ca-certificates,passwd"
PATH_ENV="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Bump TRIM when the commit step below changes what it removes or adds.
TRIM=2
ROOTFS_KEY="$(printf '%s\n' "v1" "$SUITE" "minbase" "$PACKAGES" "$PATH_ENV" | sha256sum | cut -c1-16)"
RECIPE="$ROOTFS_KEY-$TRIM"

log() { echo "image-base: $*" >&2; }

if [ "$(buildah inspect --type image \
      --format '{{index .ImageAnnotations "dev.tessera.base-recipe"}}' "$BASE_IMAGE" \
      2>/dev/null || true)" = "$RECIPE" ]; then
  log "$BASE_IMAGE is current (recipe $RECIPE)"
  echo "$BASE_IMAGE"
  exit 0
fi

old_id="$(buildah inspect --type image --format '{{.FromImageID}}' "$BASE_IMAGE" 2>/dev/null || true)"
mkdir -p "$CACHE"
tarball="$CACHE/rootfs-$SUITE-$ROOTFS_KEY.tar"
if [ ! -s "$tarball" ]; then
  work="$(mktemp -d "$CACHE/.debootstrap.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  log "debootstrap --variant=minbase --include=$PACKAGES $SUITE from $DEBIAN_MIRROR"
  start=$SECONDS
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/rootfs" "$DEBIAN_MIRROR" \
    > "$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
  tar -C "$work/rootfs" --numeric-owner -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
  rm -rf "$work"
  trap - EXIT
  log "debootstrap done in $((SECONDS - start)) s; cached at $tarball"
fi

log "committing $BASE_IMAGE (recipe $RECIPE) from $tarball"
ctr="$(buildah from scratch)"
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
mnt="$(buildah mount "$ctr")"
tar -C "$mnt" --numeric-owner -xf "$tarball"
# What python:*-slim leaves out too: package lists, apt caches, docs, man pages, locales.
rm -rf "$mnt/var/lib/apt/lists/"* "$mnt/var/cache/apt/"*.bin "$mnt/var/cache/apt/archives/"*.deb \
  "$mnt/usr/share/doc/"* "$mnt/usr/share/man/"* "$mnt/usr/share/info/"*
find "$mnt/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
# python:*-slim has `python` on PATH; Debian names it python3 only.
ln -sf /usr/bin/python3 "$mnt/usr/local/bin/python"
buildah umount "$ctr" >/dev/null
buildah config --env "PATH=$PATH_ENV" --env LANG=C.UTF-8 --cmd python3 \
  --annotation "dev.tessera.base-recipe=$RECIPE" \
  --label "org.opencontainers.image.description=debootstrap $SUITE minbase + $PACKAGES" "$ctr"
buildah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
trap - EXIT
# The stale base the new one replaces (untagged now); kept if an image still builds on it.
[ -z "$old_id" ] || buildah rmi "$old_id" >/dev/null 2>&1 || true
echo "$BASE_IMAGE"
