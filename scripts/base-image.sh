#!/usr/bin/env bash
# Build the local base image the tests and the simulated engine start from
# (`sparkctl-test/base:bookworm`: Debian minbase + python3), since no public registry is
# reachable. The debootstrap tarball is cached outside the repo, keyed by its recipe, so
# later runs on the same machine skip the ~40 s debootstrap; an empty cache still works.
set -euo pipefail

image=sparkctl-test/base:bookworm
cache=${SPARKCTL_BUILD_CACHE:-/var/cache/sparkctl-build}
recipe="debootstrap --variant=minbase --include=python3,ca-certificates bookworm"
key=$(printf '%s' "$recipe" | sha256sum | cut -c1-16)

if [ "$(docker image inspect -f '{{index .Config.Labels "sparkctl.recipe"}}' "$image" 2>/dev/null)" = "$key" ]; then
  exit 0
fi
mkdir -p "$cache"
tarball="$cache/base-bookworm-$key.tar"
if [ ! -s "$tarball" ]; then
  echo "base-image: $recipe (about 40 s, cached in $cache)"
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  $recipe "$rootfs" http://deb.debian.org/debian >/dev/null
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
fi
docker import --change "LABEL sparkctl.recipe=$key" --change 'CMD ["/bin/bash"]' "$tarball" "$image" >/dev/null
echo "base-image: $image ready"
