#!/usr/bin/env bash
# Run test tiers one after another (`scripts/tiers.sh check integration ...`), each its own pytest,
# and print each tier's time and outcome at the end, then the totals as one line. Every tier runs
# even when an earlier one failed; the exit status is 1 if any did.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTEST=${PYTEST:-.venv/bin/pytest}
declare -A PATHS=(
  [check]="tests/unit tests/sim"
  [integration]="tests/integration"
  [fleet]="tests/fleet"
  [e2e]="tests/e2e"
  [smoke]="tests/perf"
)
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT
summary=() failed=0 passed=0 broken=0 skipped=0

count() {  # the number before `$1` in pytest's closing line, or 0
  grep -E '^=+ .* in [0-9.]+s' "$2" | tail -1 | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0
}

for tier in "$@"; do
  [ -n "${PATHS[$tier]:-}" ] || { echo "tiers: no tier $tier (${!PATHS[*]})"; exit 2; }
  echo "== tier $tier: pytest ${PATHS[$tier]}"
  start=$(date +%s)
  # shellcheck disable=SC2086 - the paths are words
  "$PYTEST" ${PATHS[$tier]} --durations=15 2>&1 | tee "$log_dir/$tier.log"
  status=${PIPESTATUS[0]}
  took=$(( $(date +%s) - start ))
  p=$(count passed "$log_dir/$tier.log"); f=$(count failed "$log_dir/$tier.log")
  e=$(count error "$log_dir/$tier.log"); s=$(count skipped "$log_dir/$tier.log")
  passed=$((passed + p)); broken=$((broken + f + e)); skipped=$((skipped + s))
  [ "$status" = 0 ] || failed=1
  summary+=("$(printf '%-12s %4d:%02d  %5d passed, %d failed, %d skipped (exit %d)' "$tier" $((took / 60)) \
    $((took % 60)) "$p" "$((f + e))" "$s" "$status")")
done

echo
echo "== tiers (time, outcome)"
printf '%s\n' "${summary[@]}"
echo "total: $passed passed, $broken failed, $skipped skipped"
exit $failed
