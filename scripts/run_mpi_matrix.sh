#!/usr/bin/env bash
# Run tests/distributed under the venv's own MPICH mpiexec for several world sizes.
#
#   scripts/run_mpi_matrix.sh                  # N = 1 2 4 8
#   scripts/run_mpi_matrix.sh 2 4              # just these sizes
#   scripts/run_mpi_matrix.sh 2 -- -k smoke    # extra pytest arguments after --
#
# Environment:
#   ZEPHON_PY, ZEPHON_VENV   interpreter and venv (from `source scripts/env.sh`;
#                            sourced here if unset)
#   MPI_MATRIX_SIZES         default list of N (default "1 2 4 8")
#   MPI_MATRIX_LOGDIR        where the per-rank logs go (default: a fresh /tmp dir)
#   MPI_MATRIX_KEEP_GOING=1  run the remaining sizes after a failing one
#   MPI_MATRIX_TIMEOUT       seconds per mpiexec run (default 600)
#
# Every rank writes its own log, <logdir>/n<N>.rank<R>.log. The last stdout line
# is always "mpi: X passed, Y failed, Z skipped" (passed/skipped from the rank-0
# summaries; a failing run counts its failures, at least 1). Exit status is
# non-zero if any N failed.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

sizes=()
extra=()
while (($#)); do
  if [[ "$1" == "--" ]]; then shift; extra=("$@"); break; fi
  [[ "$1" =~ ^[1-9][0-9]*$ ]] || { echo "run_mpi_matrix: not a world size: $1" >&2; exit 2; }
  sizes+=("$1"); shift
done
((${#sizes[@]})) || read -r -a sizes <<<"${MPI_MATRIX_SIZES:-1 2 4 8}"

if [[ -z "${ZEPHON_PY:-}" || -z "${ZEPHON_VENV:-}" ]]; then
  # shellcheck source=env.sh
  source "$root/scripts/env.sh" || { echo "run_mpi_matrix: scripts/env.sh failed" >&2; exit 2; }
  set +e  # env.sh turns on errexit; this script checks every status itself
fi
py="$ZEPHON_PY"
mpiexec="$ZEPHON_VENV/bin/mpiexec"   # never a bare mpirun: it may be another MPI
for f in "$py" "$mpiexec"; do
  [[ -x "$f" ]] || { echo "run_mpi_matrix: missing $f" >&2; echo "mpi: 0 passed, 1 failed, 0 skipped"; exit 2; }
done

logdir="${MPI_MATRIX_LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/zephon-mpi-logs.XXXXXX")}"
mkdir -p "$logdir"
run_timeout="${MPI_MATRIX_TIMEOUT:-600}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1

now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Count "<n> <word>" from a pytest summary line (e.g. "3 passed, 1 skipped in 2.0s").
count() {  # count WORD LINE
  local n
  n="$(grep -oE "[0-9]+ $1\b" <<<"$2" | head -n1 | cut -d' ' -f1)"
  echo "${n:-0}"
}
summary_of() {  # the last pytest summary line of a log, or nothing
  [[ -f "$1" ]] || return 0
  grep -aE '(^|[ =])[0-9]+ (passed|failed|skipped|errors?|xfailed|xpassed|deselected)\b.* in [0-9.]+s' "$1" | tail -n1
}

echo "mpi matrix: sizes=${sizes[*]} logs=$logdir"
echo "mpi matrix: $("$mpiexec" --version 2>&1 | grep -m1 -i 'version' | sed 's/^ *//')"

# Preflight: a launcher that does not match mpi4py's MPI library starts N
# independent size-1 jobs, which would skip every min_size test and pass.
t0="$(now)"
if ! pre_out="$(timeout -k 10 120 "$mpiexec" -n 2 "$py" -c '
from mpi4py import MPI
size = MPI.COMM_WORLD.Get_size()
if size != 2:
    raise SystemExit(f"preflight: COMM_WORLD size is {size}, expected 2 ({MPI.Get_library_version().splitlines()[0]})")
' 2>&1)"; then
  echo "run_mpi_matrix: PREFLIGHT FAILED (mpiexec -n 2 does not give a 2-rank COMM_WORLD):" >&2
  echo "$pre_out" | tail -n 30 >&2
  echo "mpi: 0 passed, 1 failed, 0 skipped"
  exit 1
fi
echo "mpi preflight: ok ($(elapsed "$t0" "$(now)")s)"

passed=0 failed=0 skipped=0 bad_sizes=()
matrix_t0="$(now)"
for n in "${sizes[@]}"; do
  rm -f "$logdir/n$n".rank*.log "$logdir/n$n.launcher.log"
  t0="$(now)"
  # Each rank sends its output to its own file (Hydra sets PMI_RANK).
  timeout -k 10 "$run_timeout" "$mpiexec" -n "$n" \
    bash -c 'r="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}"; exec "$@" >"$0.rank$r.log" 2>&1' "$logdir/n$n" \
    "$py" -m mpi4py -m pytest tests/distributed --only-mpi -x -q -p no:cacheprovider \
    --timeout=300 --timeout-method=thread "${extra[@]}" \
    >"$logdir/n$n.launcher.log" 2>&1
  rc=$?
  wall="$(elapsed "$t0" "$(now)")"
  s0="$(summary_of "$logdir/n$n.rank0.log")"
  p="$(count passed "$s0")" s="$(count skipped "$s0")"
  # failures: the worst rank's count (an aborted rank 0 may have no summary)
  f=0
  for log in "$logdir/n$n".rank*.log; do
    [[ -f "$log" ]] || continue
    sl="$(summary_of "$log")"
    fl=$(($(count failed "$sl") + $(count error "$sl") + $(count errors "$sl")))
    ((fl > f)) && f=$fl
  done
  if ((rc != 0)); then
    ((f < 1)) && f=1
    [[ $rc -eq 124 || $rc -eq 137 ]] && why="timed out after ${run_timeout}s" || why="rc=$rc"
    echo "mpi N=$n: FAILED ($why) in ${wall}s  rank0: ${s0:-<no summary>}"
    for log in "$logdir/n$n".rank*.log "$logdir/n$n.launcher.log"; do
      [[ -s "$log" ]] || continue
      echo "----- tail of $log -----"
      # without pytest-mpi's long "MPI Information" block
      awk '/^=+ MPI Information =+$/ { skip = 1; next } skip && /^=/ { skip = 0 } !skip' "$log" | tail -n 50
    done
    echo "----- end of N=$n logs -----"
    bad_sizes+=("$n")
  elif ((f > 0)); then  # cannot happen with a sane launcher; be loud anyway
    echo "mpi N=$n: FAILED (rc=0 but a rank reports failures) in ${wall}s  rank0: $s0"
    bad_sizes+=("$n")
  else
    echo "mpi N=$n: ok in ${wall}s  rank0: ${s0:-<no summary>}"
  fi
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  if ((${#bad_sizes[@]})) && [[ "${MPI_MATRIX_KEEP_GOING:-0}" != 1 ]]; then
    echo "mpi matrix: stopping after the first failing size (MPI_MATRIX_KEEP_GOING=1 runs the rest)"
    break
  fi
done
echo "mpi matrix: wall ${matrix_t0:+$(elapsed "$matrix_t0" "$(now)")}s${bad_sizes[*]:+, failing N: ${bad_sizes[*]}}"
echo "mpi: $passed passed, $failed failed, $skipped skipped"
((${#bad_sizes[@]} == 0))
