#!/usr/bin/env bash
# axe-core, the accessibility checker the dashboard's browser test runs in the page: fetched from
# npm once and kept in SPARKCTL_BUILD_CACHE (the project does not ship it).
set -euo pipefail
VERSION=4.14.1
dest="${SPARKCTL_BUILD_CACHE:-$HOME/.cache/sparkctl-build}/axe-core-$VERSION"
[ -f "$dest/axe.min.js" ] && exit 0
command -v npm >/dev/null || { echo "axe-setup: npm is missing: the dashboard's accessibility check will fail"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "axe-core@$VERSION" >/dev/null && tar xzf "axe-core-$VERSION.tgz")
mkdir -p "$dest"
cp "$tmp/package/axe.min.js" "$tmp/package/LICENSE" "$dest/"
echo "axe-setup: axe-core $VERSION (MPL-2.0) in $dest"
