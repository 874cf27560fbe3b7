#!/usr/bin/env bash
# GPT pretraining with only the megatron-core wheel (>= 0.17, Python >= 3.12): no checkout.
#
#   NPROC=8 TP=2 bash configs/megatron/pretrain_gpt_wheel.sh [more flags]
#
# zephon_megatron.pretrain_gpt brings its own forward_step / get_batch and
# builds the model from the flags; --dataloader-type defaults to zephon.
# Run the same command again to resume from the latest checkpoint.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
exec "${TORCHRUN[@]}" -m zephon_megatron.pretrain_gpt "${MODEL_FLAGS[@]}" "${ZEPHON_FLAGS[@]}" "$@"
