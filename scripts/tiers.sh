#!/usr/bin/env bash
# Run test tiers, each its own pytest, and print each tier's time and outcome at the end, then the
# totals as one line. `scripts/tiers.sh check integration` runs them one after another, their
# output as it comes; `scripts/tiers.sh -j 2 integration fleet ...` runs up to two at once,
# starting them in the order given as places free up, and prints each tier's output whole when it
# ends. A tier in ALONE runs with nothing beside it. Every tier runs even when another failed; the
# exit status is 1 if any did.
#
# Side by side pays where tiers wait rather than compute (engines loading, daemons, Ray): their
# instances, ports, registries, namespaces and run ids are apart, and the one test that restarts
# a dockerd restarts its own.
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=1
if [ "${1:-}" = "-j" ]; then jobs=$2; shift 2; fi
PYTEST=${PYTEST:-.venv/bin/pytest}
# A tier named here runs alone: after every tier started before it has ended, and nothing starts
# beside it. `memory` reads MemAvailable, which other tiers' engines move by gigabytes.
ALONE=" memory "
declare -A PATHS=(
  [check]="-n 2 tests/unit tests/sim"  # two workers: these tests mostly wait (servers, sleeps of the sim)
  [integration]="tests/integration --ignore=tests/integration/memory"
  [memory]="tests/integration/memory"
  [fleet]="tests/fleet"
  [e2e]="tests/e2e"
  [smoke]="tests/perf"
)
for tier in "$@"; do
  [ -n "${PATHS[$tier]:-}" ] || { echo "tiers: no tier $tier (${!PATHS[*]})"; exit 2; }
done
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT
started=$(date +%s)

run() {  # one tier: its pytest's output in its log, then "<exit status> <seconds>" in <tier>.done
  local tier=$1 start
  start=$(date +%s)
  # shellcheck disable=SC2086 - the paths are words
  "$PYTEST" ${PATHS[$tier]} --durations=15 > "$log_dir/$tier.log" 2>&1
  echo "$? $(( $(date +%s) - start ))" > "$log_dir/$tier.done"
}

count() {  # the number before `$1` in pytest's closing line, or 0
  grep -E '^=+ .* in [0-9.]+s' "$2" | tail -1 | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0
}

shown=()
show_ended() {  # the whole output of each tier that ended since the last call
  local tier
  for tier in "$@"; do
    if [ -e "$log_dir/$tier.done" ] && [[ ! " ${shown[*]} " =~ " $tier " ]]; then
      echo "== tier $tier ended: pytest ${PATHS[$tier]}"
      cat "$log_dir/$tier.log"
      shown+=("$tier")
    fi
  done
}

if [ "$jobs" = 1 ]; then
  for tier in "$@"; do
    echo "== tier $tier: pytest ${PATHS[$tier]}"
    : > "$log_dir/$tier.log"
    run "$tier" &
    tail --pid=$! -n +1 -f "$log_dir/$tier.log"
    wait
  done
else
  running=0
  for tier in "$@"; do
    limit=$jobs
    [[ "$ALONE" =~ " $tier " ]] && limit=1
    while [ "$running" -ge "$limit" ]; do wait -n; running=$((running - 1)); show_ended "$@"; done
    echo "== tier $tier started at $(( $(date +%s) - started )) s: pytest ${PATHS[$tier]}"
    run "$tier" &
    running=$((running + 1))
    if [[ "$ALONE" =~ " $tier " ]]; then wait -n; running=0; show_ended "$@"; fi
  done
  while [ "$running" -gt 0 ]; do wait -n; running=$((running - 1)); show_ended "$@"; done
fi

summary=() failed=0 passed=0 broken=0 skipped=0
for tier in "$@"; do
  read -r status took < "$log_dir/$tier.done"
  log=$log_dir/$tier.log
  p=$(count passed "$log"); f=$(count failed "$log"); e=$(count error "$log"); s=$(count skipped "$log")
  passed=$((passed + p)); broken=$((broken + f + e)); skipped=$((skipped + s))
  [ "$status" = 0 ] || failed=1
  summary+=("$(printf '%-12s %4d:%02d  %5d passed, %d failed, %d skipped (exit %d)' "$tier" $((took / 60)) \
    $((took % 60)) "$p" "$((f + e))" "$s" "$status")")
done

echo
echo "== tiers (time, outcome)"
printf '%s\n' "${summary[@]}"
took=$(( $(date +%s) - started ))
printf 'total: %d passed, %d failed, %d skipped in %d:%02d (%d at once)\n' "$passed" "$broken" "$skipped" \
  $((took / 60)) $((took % 60)) "$jobs"
exit $failed
