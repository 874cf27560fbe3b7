#!/usr/bin/env bash
# Every test: lint and type check, the serial suite (unit, property, e2e) and the MPI matrix.
# Builds the environment on first use. Ends with one line (lint counts as one check):
#   zephon: N passed, N failed, N skipped
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/env.sh
export PYTHONPATH="$root:$root/integrations/torchtitan:$root/integrations/megatron${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
art="$root/.artifacts"
rm -rf "$art" && mkdir -p "$art"
export ZEPHON_CACHE_DIR="$art/index-cache"

status=0
echo "== lint"
bash scripts/lint.sh > "$art/lint.log" 2>&1
lint_rc=$?
tail -n 30 "$art/lint.log"
[[ $lint_rc -ne 0 ]] && status=1

echo "== serial suite"
timeout -k 30 4200 "$ZEPHON_PY" -m pytest tests -q -ra --timeout=1200 --junitxml="$art/serial.xml" "$@"
rc=$?
[[ $rc -ne 0 && $rc -ne 5 ]] && status=1

echo "== MPI matrix"
bash scripts/run_mpi_matrix.sh | tee "$art/mpi.log"
[[ ${PIPESTATUS[0]} -ne 0 ]] && status=1

"$ZEPHON_PY" - "$art/serial.xml" "$art/mpi.log" "$lint_rc" <<'PY'
import re, sys, xml.etree.ElementTree as ET
p = f = s = 0
if sys.argv[3] == "0":
    p += 1
else:
    f += 1
try:
    for suite in ET.parse(sys.argv[1]).getroot().iter("testsuite"):
        t, e, fl, sk = (int(suite.get(k, 0)) for k in ("tests", "errors", "failures", "skipped"))
        p += t - e - fl - sk; f += e + fl; s += sk
except (OSError, ET.ParseError):
    f += 1
m = None
for line in open(sys.argv[2], errors="replace"):
    m = re.match(r"mpi: (\d+) passed, (\d+) failed, (\d+) skipped", line.strip()) or m
if m:
    p += int(m[1]); f += int(m[2]); s += int(m[3])
else:
    f += 1
print(f"zephon: {p} passed, {f} failed, {s} skipped")
PY
exit $status
