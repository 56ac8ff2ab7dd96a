#!/usr/bin/env bash
# What `make perf` needs beyond `make setup`: nginx, the reference proxy of the gateway
# benchmark. Installed from Debian without starting its default site (nothing may listen
# beyond loopback); the benchmark runs its own loopback-only nginx.
set -euo pipefail
command -v nginx >/dev/null && exit 0
if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
  echo "perf-setup: nginx is missing; install it (Debian: apt-get install nginx)" >&2; exit 1
fi
echo "perf-setup: installing nginx (not started)"
policy=/usr/sbin/policy-rc.d
had_policy=0; [ -e "$policy" ] && had_policy=1
[ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; }
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
[ "$had_policy" = 1 ] || rm -f "$policy"
