#!/bin/sh
# Run one command in an image's root filesystem the way the chart runs its pods: root
# filesystem read-only, uid/gid 10001, a fresh tmpfs on /tmp (the chart's emptyDir), a
# minimal /dev, /proc, /sys read-only, and read-only bind mounts (the model cache, the routes
# ConfigMap). Network: the host's (127.0.0.1 ports).
#
#   unshare --mount -- run-in-rootfs.sh ROOTFS WORKDIR [SRC:DST ...] -- [NAME=VALUE ...] CMD [ARG ...]
#
# ROOTFS is a `buildah mount` of a container of the image (its writable layer only gets the
# mount points); WORKDIR an empty host directory to assemble the new root in; NAME=VALUE the
# whole environment (the image's config plus extras). Runs in a private mount namespace
# (unshare), so nothing leaks to the host; execs, so the caller's pid is the command's.
# Caller: tests/image/image_check.py (`make image-check`). Needs root (then drops to 10001).
set -eu
rootfs=$1 new=$2
shift 2
mount --make-rprivate /
mount --bind "$rootfs" "$new"
mount -t proc proc "$new/proc"
mount --rbind /sys "$new/sys"
mount -o remount,bind,ro "$new/sys"
mount -t tmpfs -o mode=755,size=16m,nosuid tmpfs "$new/dev"
for d in null zero full random urandom; do
  touch "$new/dev/$d"
  mount --bind "/dev/$d" "$new/dev/$d"
done
mkdir "$new/dev/shm"
mount -t tmpfs -o mode=1777,size=2g,nosuid,nodev tmpfs "$new/dev/shm"
ln -s /proc/self/fd "$new/dev/fd"
mount -t tmpfs -o mode=1777,size=1g,nosuid,nodev tmpfs "$new/tmp"
while [ "$1" != -- ]; do
  src=${1%%:*} dst=${1#*:}
  mkdir -p "$new$dst"
  mount --bind "$src" "$new$dst"
  mount -o remount,bind,ro "$new$dst"
  shift
done
shift
mount -o remount,bind,ro "$new"
# env(1) of the image: a clean environment of the NAME=VALUE arguments, the image's workdir.
exec chroot --userspec=10001:10001 --groups=10001 "$new" /usr/bin/env -i -C /home/tessera "$@"
