#!/usr/bin/env bash
# The tests. Builds the environment on first use.
#
#   bash scripts/test.sh                      # everything: lint and type check, the serial suite
#                                             # (unit, property, reliability) beside the e2e launches,
#                                             # then the MPI matrix
#   bash scripts/test.sh --fast               # the inner loop: lint and the serial suite without the
#                                             # e2e tests (those marked e2e: every torchrun training
#                                             # launch), without the whole-topology property tests
#                                             # (marked topology) and without the MPI matrix; pytest
#                                             # options may follow (--fast -x, --fast -k restore)
#   bash scripts/test.sh tests/unit/core      # only this pytest selection (any pytest arguments:
#   bash scripts/test.sh -k restore -x        # paths, -k, -m, -x ...); no lint, no MPI matrix
#   bash scripts/test.sh --lint --mpi tests/unit/core   # a selection plus lint and the matrix
#
# Ends with one line (lint counts as one check; a skipped stage counts nothing):
#   zephon: N passed, N failed, N skipped
# Ctrl-C or SIGTERM stops every process it started (pytest, torchrun and MPI ranks included,
# even those in sessions of their own) and exits 130 / 143.
# ZEPHON_ARTIFACTS: where logs, the JUnit XML and the index cache go (default .artifacts/).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

lint=1 mpi=1 fast=0 selection=()
if (($#)); then
  lint=0 mpi=0
  for arg in "$@"; do
    case "$arg" in
      --lint) lint=1 ;;
      --mpi) mpi=1 ;;
      --fast) fast=1 lint=1 ;;
      *) selection+=("$arg") ;;
    esac
  done
fi

# -- stopping everything on Ctrl-C / SIGTERM ---------------------------------------------
# Stages run in the background and are waited for, so a signal is handled at once (bash
# defers traps while a foreground child runs). The process tree is read before anything is
# signalled: children that started their own session (timeout, torchrun launches) are still
# descendants then, and would be orphaned if their parent died first.
_descendants() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do
    echo "$child"
    _descendants "$child"
  done
}
_stop_all() {
  local code="$1" pids alive n
  trap '' INT TERM
  pids="$(_descendants $$)"
  if [[ -n "$pids" ]]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null
    for _ in $(seq 50); do
      alive=""
      for p in $pids; do kill -0 "$p" 2>/dev/null && alive+=" $p"; done
      [[ -z "$alive" ]] && break
      sleep 0.1
    done
    # shellcheck disable=SC2086
    [[ -n "$alive" ]] && kill -KILL $alive 2>/dev/null
  fi
  n="$(wc -w <<<"$pids")"
  echo "zephon: interrupted; stopped ${n// /} process(es)" >&2
  exit "$code"
}
trap '_stop_all 130' INT
trap '_stop_all 143' TERM

run_stage() {  # run_stage CMD...: in the background, waited for; sets $rc
  "$@" &
  local pid=$!
  wait "$pid"
  rc=$?
}

source scripts/env.sh || exit 1
export PYTHONPATH="$root:$root/integrations/torchtitan:$root/integrations/megatron:$root/integrations/torchft${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
art="${ZEPHON_ARTIFACTS:-$root/.artifacts}"
rm -rf "$art" && mkdir -p "$art"
export ZEPHON_CACHE_DIR="$art/index-cache"

status=0 rc=0
# Lint, the loader-level tests and the e2e launches are independent: in a full or --fast run
# they go side by side (a launch spends most of its ~25 s importing, one core while the other
# runs tests); each pytest stream has its own temp folder and JUnit XML. ZEPHON_TEST_STREAMS=1
# runs them one after another instead.
side_by_side=$(( ${ZEPHON_TEST_STREAMS:-2} > 1 ))
pids=() names=() failed=()
start_stage() {  # start_stage NAME CMD...: in the background; wait_stages collects them
  names+=("$1"); shift
  "$@" &
  pids+=("$!")
  ((side_by_side)) || wait_stages
}
wait_stages() {
  local i
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    case "${names[$i]}" in
      lint) lint_rc=$rc ;;
      *) if [[ $rc -ne 0 && $rc -ne 5 ]]; then status=1; failed+=("${names[$i]}"); fi ;;
    esac
  done
  pids=() names=()
}
pytest_stage() {  # pytest_stage NAME PYTEST-ARGS...: one stream of the suite, its XML at $art/NAME.xml
  local name="$1"; shift
  xmls+=("$art/$name.xml")
  # Temp folders outside the clone (tests check that what they install runs from elsewhere),
  # removed after a run that passed.
  local tmp
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/zephon-tests-$name-XXXXXX")"
  temps+=("$tmp")
  start_stage "$name" timeout -k 30 4200 "$ZEPHON_PY" -m pytest -q -ra --timeout=1200 \
    --basetemp="$tmp" --junitxml="$art/$name.xml" "$@"
}

lint_rc=skipped
if ((lint)); then
  echo "== lint (log: $art/lint.log)"
  start_stage lint bash -c 'bash scripts/lint.sh > "$1" 2>&1' lint "$art/lint.log"
fi

xmls=() temps=() streams=() mpi_log=skipped
# The loader-level suite runs as two streams, the core's unit tests and everything else, one a core.
split=(tests/unit/core) rest=(tests --ignore=tests/unit/core)
if (($# == 0)); then
  echo "== serial suite and e2e launches, side by side (logs: $art/{core,rest,e2e}.log)"
  streams=(core rest e2e)
  pytest_stage core "${split[@]}" -m "not e2e" > "$art/core.log" 2>&1
  pytest_stage rest "${rest[@]}" -m "not e2e" > "$art/rest.log" 2>&1
  pytest_stage e2e tests -m e2e > "$art/e2e.log" 2>&1
  if ((mpi && side_by_side)); then  # the MPI matrix once both loader-level streams are done, beside the e2e launches left
    echo "== MPI matrix (after core and rest; log: $art/mpi.log)"
    mpi_log="$art/mpi.log" mpi=0
    start_stage mpi bash -c 'while kill -0 "$1" 2>/dev/null || kill -0 "$2" 2>/dev/null; do sleep 1; done
      bash scripts/run_mpi_matrix.sh > "$3" 2>&1' mpi "${pids[-3]}" "${pids[-2]}" "$mpi_log"
  fi
elif ((fast)); then
  echo "== serial suite without e2e or topology tests"
  fast_m="not e2e and not topology"
  positional=0
  for arg in "${selection[@]}"; do [[ "$arg" == -* ]] || positional=1; done
  if ((positional)); then  # paths of its own: one stream
    pytest_stage serial tests -m "$fast_m" "${selection[@]}"
  else
    streams=(core rest)
    pytest_stage core "${split[@]}" -m "$fast_m" "${selection[@]}" > "$art/core.log" 2>&1
    pytest_stage rest "${rest[@]}" -m "$fast_m" "${selection[@]}" > "$art/rest.log" 2>&1
  fi
elif ((${#selection[@]})); then
  echo "== pytest ${selection[*]}"
  pytest_stage serial "${selection[@]}"
fi
wait_stages
((status)) || rm -rf "${temps[@]}"
if [[ $lint_rc != skipped ]]; then
  tail -n 30 "$art/lint.log"
  [[ $lint_rc -ne 0 ]] && status=1
fi
[[ $mpi_log == skipped ]] || { echo "== MPI matrix"; cat "$mpi_log"; }
for name in "${streams[@]}"; do  # a failing stream's whole log (its tracebacks); of a passing one, all with --fast, else its summary
  echo "== $name"
  if ((fast)) || [[ " ${failed[*]} " == *" $name "* ]]; then cat "$art/$name.log"; else tail -n 5 "$art/$name.log"; fi
done

if ((mpi)); then
  echo "== MPI matrix"
  mpi_log="$art/mpi.log"
  run_stage bash -c 'bash scripts/run_mpi_matrix.sh | tee "$1"; exit "${PIPESTATUS[0]}"' mpi "$mpi_log"
  [[ $rc -ne 0 ]] && status=1
fi

"$ZEPHON_PY" - "$mpi_log" "$lint_rc" "${xmls[@]}" <<'PY'
import re, sys, xml.etree.ElementTree as ET
mpi_log, lint, *xmls = sys.argv[1:]
p = f = s = 0
if lint != "skipped":
    p, f = (1, 0) if lint == "0" else (0, 1)
for xml in xmls:
    try:
        for suite in ET.parse(xml).getroot().iter("testsuite"):
            t, e, fl, sk = (int(suite.get(k, 0)) for k in ("tests", "errors", "failures", "skipped"))
            p += t - e - fl - sk; f += e + fl; s += sk
    except (OSError, ET.ParseError):
        f += 1
if mpi_log != "skipped":
    m = None
    for line in open(mpi_log, errors="replace"):
        m = re.match(r"mpi: (\d+) passed, (\d+) failed, (\d+) skipped", line.strip()) or m
    if m:
        p += int(m[1]); f += int(m[2]); s += int(m[3])
    else:
        f += 1
print(f"zephon: {p} passed, {f} failed, {s} skipped")
PY
exit $status
