#!/usr/bin/env bash
# build-image.sh IMAGE CONTEXT_DIR [--with-torch-wheel | --with-sim]
# Build a local image from a context dir unless an image built from the same content exists
# (label sparkctl.context = sha256 of the context files). Builds run with host networking and
# the host's CA bundle, since package downloads go through a TLS-intercepting path here.
set -euo pipefail
image=$1 src=$2 extra=${3:-}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp -a "$src"/. "$ctx"/
cp /etc/ssl/certs/ca-certificates.crt "$ctx"/
if [ "$extra" = --with-sim ]; then  # the sim package alone, without the rest of sparkctl
  root=$(cd "$(dirname "$0")/.." && pwd)
  mkdir -p "$ctx/pkg/sparkctl"
  cp "$root/src/sparkctl/__init__.py" "$ctx/pkg/sparkctl/"
  (cd "$root/src/sparkctl" && find sim -name '*.py' ! -path 'sim/image/*' -exec cp --parents {} "$ctx/pkg/sparkctl/" \;)
fi
if [ "$extra" = --with-torch-wheel ]; then
  mkdir -p "$ctx/wheels"
  wheel=$(ls /opt/wheels/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -n1 || true)
  [ -n "$wheel" ] || { echo "build-image: no torch 2.13.0+cpu wheel in /opt/wheels"; exit 1; }
  cp "$wheel" "$ctx/wheels/"
fi
find "$ctx" -name __pycache__ -prune -exec rm -rf {} +
# The CA bundle and the wheel's bytes don't define the image: hash their names, not contents.
key=$( (cd "$ctx" && find . -type f ! -name ca-certificates.crt ! -path './wheels/*' -print0 | sort -z \
        | xargs -0 sha256sum; ls "$ctx/wheels" 2>/dev/null || true) | sha256sum | cut -c1-16)

if [ "$(docker image inspect -f '{{index .Config.Labels "sparkctl.context"}}' "$image" 2>/dev/null)" = "$key" ]; then
  exit 0
fi
echo "build-image: building $image from $src (context $key)"
if ! DOCKER_BUILDKIT=0 docker build --network host --label "sparkctl.context=$key" -t "$image" "$ctx" \
    >"$ctx.log" 2>&1; then
  tail -n 40 "$ctx.log"; rm -f "$ctx.log"; echo "build-image: building $image failed"; exit 1
fi
rm -f "$ctx.log"
echo "build-image: $image ready"
