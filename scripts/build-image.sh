#!/usr/bin/env bash
# build-image.sh IMAGE CONTEXT_DIR [--with-torch-wheel]
# Build a local image from a context dir unless an image built from the same content exists
# (label sparkctl.context = sha256 of the context files). Builds run with host networking and
# the host's CA bundle, since package downloads go through a TLS-intercepting path here.
set -euo pipefail
image=$1 src=$2 torch=${3:-}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp -a "$src"/. "$ctx"/
cp /etc/ssl/certs/ca-certificates.crt "$ctx"/
if [ "$torch" = --with-torch-wheel ]; then
  mkdir -p "$ctx/wheels"
  wheel=$(ls /opt/wheels/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -n1 || true)
  [ -n "$wheel" ] || { echo "build-image: no torch 2.13.0+cpu wheel in /opt/wheels"; exit 1; }
  cp "$wheel" "$ctx/wheels/"
fi
# The CA bundle and the wheel's bytes don't define the image: hash their names, not contents.
key=$( (cd "$ctx" && find . -type f ! -name ca-certificates.crt ! -path './wheels/*' -print0 | sort -z \
        | xargs -0 sha256sum; ls "$ctx/wheels" 2>/dev/null) | sha256sum | cut -c1-16)

if [ "$(docker image inspect -f '{{index .Config.Labels "sparkctl.context"}}' "$image" 2>/dev/null)" = "$key" ]; then
  exit 0
fi
echo "build-image: building $image from $src (context $key)"
DOCKER_BUILDKIT=0 docker build -q --network host --label "sparkctl.context=$key" -t "$image" "$ctx" >/dev/null
echo "build-image: $image ready"
