#!/usr/bin/env bash
# The GPU check, one script under 5 minutes on one GPU (more GPUs: Megatron runs tensor-parallel 2):
#   1. TorchTitan's llama3 debug model fed by Zephon on CUDA/NCCL: 10 steps, a checkpoint, 10 more resumed
#      from it, with Zephon's figures in TorchTitan's console (the share of time the loop waited for data);
#   2. Megatron's wheel entry on CUDA/NCCL (get_batch, and with 2 GPUs the adapter's tensor-parallel broadcast):
#      3 iterations, a checkpoint with the loader state, 3 more resumed from it;
#   3. the data-wait fraction, the model's tokens/s and the loader's own tokens/s side by side.
# Both runs are the laptop commands (python -m zephon_torchtitan.cpu / zephon_megatron.cpu) with --device cuda:
# the same launches, without the CPU shim. Without CUDA it prints one line saying why and exits 0.
#   bash scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${ZEPHON_PY:-python3}"
why="$("$py" -c 'import torch; print("" if torch.cuda.is_available() else "torch.cuda.is_available() is False")' 2>&1 \
  | tail -n 1)"
if [[ -n "$why" ]]; then
  echo "gpu_check: skipped, no CUDA device here ($why)"
  exit 0
fi
gpus="$("$py" -c 'import torch; print(torch.cuda.device_count())')"
out="${1:-$(mktemp -d -t zephon-gpu-check.XXXXXX)}"
mkdir -p "$out"
export PYTHONPATH="$root:$root/integrations/torchtitan:$root/integrations/megatron${PYTHONPATH:+:$PYTHONPATH}"
tp=1; ((gpus >= 2)) && tp=2
status=0
timeout 200 "$py" -m zephon_torchtitan.cpu --device cuda --nproc 1 --resume-nproc 1 --steps 10 --more-steps 10 \
  --metrics --loader-rate 400 --workdir "$out/torchtitan" >"$out/torchtitan.log" 2>&1 || status=1
timeout 150 "$py" -m zephon_megatron.cpu --device cuda --tp "$tp" --nproc "$tp" --resume-nproc "$tp" \
  --workdir "$out/megatron" >"$out/megatron.log" 2>&1 || status=1
echo "gpu_check: torchtitan $(grep -c 'step: ' "$out/torchtitan.log") steps logged, megatron" \
  "$(grep -c 'lm loss' "$out/megatron.log") iterations logged (tp=$tp); logs in $out"
grep -h "zephon: loader state restored" "$out/torchtitan.log" "$out/megatron.log"
echo "data wait (TorchTitan, last step): $(grep -o 'waited [^|]*' "$out/torchtitan.log" | tail -n 1)"
echo "model tokens/s (TorchTitan, last step): $(grep -o 'tps: *[0-9,]*' "$out/torchtitan.log" | tail -n 1)"
grep -h "zephon: the loader alone" "$out/torchtitan.log"
((status)) && echo "gpu_check: FAILED (see the logs)"
exit "$status"
