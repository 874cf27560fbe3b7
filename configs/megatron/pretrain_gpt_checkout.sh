#!/usr/bin/env bash
# A Megatron-LM checkout's own pretrain_gpt.py, unchanged, fed by Zephon.
#
#   MEGATRON_LM=/path/to/Megatron-LM NPROC=8 TP=2 bash configs/megatron/pretrain_gpt_checkout.sh [more flags]
#
# zephon_megatron.launch installs the adapter, then runs the script; with
# --dataloader-type zephon the script's GPT dataset provider is replaced by
# Zephon's, everything else (model, forward_step, get_batch) is the script's.
# Run the same command again to resume from the latest checkpoint.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
: "${MEGATRON_LM:?set MEGATRON_LM to your Megatron-LM checkout}"
export PYTHONPATH="$PYTHONPATH:$MEGATRON_LM"
exec "${TORCHRUN[@]}" -m zephon_megatron.launch "$MEGATRON_LM/pretrain_gpt.py" \
  --dataloader-type zephon "${MODEL_FLAGS[@]}" "${ZEPHON_FLAGS[@]}" "$@"
