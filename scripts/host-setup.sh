#!/usr/bin/env bash
# Make sure a Docker engine with compose v2, Debian's registry, debootstrap and Chromium (the
# dashboard's browser tests, driven by Playwright) are here.
# On a machine that already has a working engine and compose v2 (any Spark), this changes
# nothing. On a bare Debian 12 machine run as root, it installs dockerd 26 + compose v2 from
# trixie (bookworm's docker.io has no compose v2) and starts dockerd without a bridge: every
# container sparkctl and its tests run uses host networking.
set -euo pipefail

say() { printf 'host-setup: %s\n' "$*"; }

# The engine's checks are `sparkctl doctor`'s, the same a Spark owner runs (Makefile: the venv first).
SPARKCTL="${SPARKCTL:-$(dirname "$0")/../.venv/bin/sparkctl}"
engine_ok() { "$SPARKCTL" doctor --only docker,compose >/dev/null 2>&1; }
# `ip` (iproute2), nsenter and unshare: the fleet tests' hosts are network namespaces (tests/fleet).
tools_ok() {
  command -v docker-registry >/dev/null && command -v debootstrap >/dev/null && command -v ip >/dev/null &&
    command -v nsenter >/dev/null && command -v unshare >/dev/null && command -v chromium >/dev/null
}

# Only these come from trixie, named per package: `-t trixie` would take ~139 packages (libc6,
# python3...) from trixie and half-upgrade the system; this takes docker.io, docker-cli,
# docker-buildx, docker-compose and containerd. tests/integration/test_host_setup.py checks it.
install_docker() { apt-get install -y "$@" docker.io/trixie docker-compose/trixie; }

add_trixie() {
  [ -f /etc/apt/sources.list.d/sparkctl-trixie.sources ] && return 0
  cat >/etc/apt/sources.list.d/sparkctl-trixie.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  cat >/etc/apt/preferences.d/sparkctl-trixie <<'PIN'
Package: *
Pin: release n=trixie
Pin-Priority: 100
PIN
}

if [ "${1:-}" = --simulate ]; then  # what the install would do, as `apt-get -s` (for the test)
  add_trixie && apt-get update -qq && install_docker -s
  exit
fi

if engine_ok && tools_ok; then
  exit 0
fi

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
  engine_ok || { say "no Docker engine with compose v2 reachable; install Docker and retry"; exit 1; }
  say "docker-registry, debootstrap, iproute2 or chromium is missing: the registry, fleet and dashboard tests" \
    "will fail"; exit 1
fi

if ! command -v dockerd >/dev/null || ! docker compose version >/dev/null 2>&1 || ! tools_ok; then
  say "installing docker.io + compose v2 (trixie), docker-registry, debootstrap, iproute2, chromium"
  add_trixie
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  install_docker -qq >/dev/null
  apt-get install -y -qq debootstrap docker-registry iproute2 util-linux chromium >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (--bridge=none --iptables=false), log in /var/log/sparkctl-dockerd.log"
  setsid dockerd --bridge=none --iptables=false >/var/log/sparkctl-dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
fi
engine_ok || { say "dockerd did not come up; see /var/log/sparkctl-dockerd.log"; exit 1; }
"$SPARKCTL" doctor --only docker,compose
