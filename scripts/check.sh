#!/usr/bin/env bash
# The checks CI runs before the slow tests, in order, stopping at the first failure:
# ruff lint, ruff format, mypy, the import checks (no cycle, no import of a higher layer), then
# the fast test loop (pytest -m "not slow"; `pytest -m slow` runs the rest).
#   bash scripts/check.sh               # everything
#   bash scripts/check.sh --no-tests    # lint, types and imports only
# Tools come from the venv scripts/install.sh makes (./.venv; VENV=path picks another). The
# checkout itself goes first on PYTHONPATH, so its code is tested whichever checkout the
# venv's editable install points at.
set -uo pipefail
cd "$(dirname "$0")/.."

run_tests=1
for arg in "$@"; do
  case "$arg" in
    --no-tests) run_tests=0 ;;
    -h | --help)
      sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "check.sh: unknown argument $arg (use --no-tests)" >&2
      exit 2
      ;;
  esac
done

venv=${VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "check.sh: no Python in $venv/bin (run scripts/install.sh, or set VENV)" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

summary=()
started_all=$EPOCHREALTIME

step() {
  local name=$1
  shift
  echo "==> $name"
  local started=$EPOCHREALTIME
  "$@"
  local status=$?
  local seconds
  seconds=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  if [ "$status" -ne 0 ]; then
    echo "FAILED: $name (exit $status, ${seconds} s)" >&2
    exit "$status"
  fi
  summary+=("$(printf '%-22s %7s s' "$name" "$seconds")")
  echo "ok: $name (${seconds} s)"
}

fast_tests() {
  "$venv/bin/python" -m pytest -m "not slow" -q
  local status=$?
  # pytest exits 5 when it collected no test: a failure here, not a pass.
  [ "$status" -eq 5 ] && echo "pytest collected no tests" >&2
  return "$status"
}

step "ruff check" "$venv/bin/ruff" check .
step "ruff format" "$venv/bin/ruff" format --check .
step "mypy" "$venv/bin/mypy"
step "import cycles" "$venv/bin/python" scripts/check_import_cycles.py
step "import layers" "$venv/bin/python" scripts/check_layers.py
if [ "$run_tests" -eq 1 ]; then
  step "fast tests" fast_tests
fi

echo
echo "all checks passed:"
printf '  %s\n' "${summary[@]}"
printf '  %-22s %7s s\n' "total" "$(awk -v a="$started_all" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')"
