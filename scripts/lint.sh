#!/usr/bin/env bash
# Lint (ruff) and type check (mypy), both configured in pyproject.toml. Builds the environment on first use.
# Ends with one line: "lint: ok" or "lint: FAILED (ruff|mypy)".
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/env.sh
failed=()
echo "== ruff"
"$ZEPHON_VENV/bin/ruff" check . || failed+=(ruff)
echo "== mypy"
"$ZEPHON_PY" -m mypy --cache-dir "${TMPDIR:-/tmp}/zephon-mypy-cache" || failed+=(mypy)
if ((${#failed[@]})); then
  echo "lint: FAILED (${failed[*]})"
  exit 1
fi
echo "lint: ok"
