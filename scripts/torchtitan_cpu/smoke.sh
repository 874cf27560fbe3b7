#!/usr/bin/env bash
# Manual smoke run of the TorchTitan CPU harness (not collected by pytest):
#   (a) 0.3.0, 2 procs FSDP: 4 steps with checkpoints every 2, then resume to 6
#   (b) 0.2.2 (job TOML), same
#   (c) 0.3.0, 4 procs FSDP 2 x TP 2, 2 steps
# Usage: bash scripts/torchtitan_cpu/smoke.sh [OUT_DIR]   (~4-8 min on 2 cores)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../env.sh"
out="${1:-$(mktemp -d -t zephon-tt-smoke.XXXXXX)}"
H=(timeout 1200 "$ZEPHON_PY" "$here/harness.py" --assets-dir "$out/assets" --timeout 900)
ck=(--checkpoint.enable --checkpoint.interval 2 --lr_scheduler.total_steps 6)
summary() { "$ZEPHON_PY" -c 'import json,sys; r=json.load(sys.stdin); print(sys.argv[1], "rc", r["returncode"], "wall_s", r["wall_s"], "start", r["start_step"], "losses", r["losses"])' "$1"; }
"${H[@]}" --version 0.3 --nproc 2 --dump-folder "$out/a" -- --training.steps 4 "${ck[@]}" | summary "a 0.3.0 fsdp2 steps1-4"
"${H[@]}" --version 0.3 --nproc 2 --dump-folder "$out/a" -- --training.steps 6 "${ck[@]}" | summary "a 0.3.0 fsdp2 resume"
"${H[@]}" --version 0.2 --nproc 2 --dump-folder "$out/b" -- --training.steps 4 "${ck[@]}" | summary "b 0.2.2 fsdp2 steps1-4"
"${H[@]}" --version 0.2 --nproc 2 --dump-folder "$out/b" -- --training.steps 6 "${ck[@]}" | summary "b 0.2.2 fsdp2 resume"
"${H[@]}" --version 0.3 --nproc 4 --dump-folder "$out/c" -- --training.steps 2 --parallelism.tensor_parallel_degree 2 | summary "c 0.3.0 fsdp2xtp2"
echo "logs under $out"
