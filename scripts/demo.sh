#!/usr/bin/env bash
# The demo: a real elastic TorchTitan training run on CPU (dp=4 -> checkpoint ->
# dp=2), checked step by step. Builds the environment on first use.
#   bash scripts/demo.sh               # the training demo (~2 minutes on 2 cores)
#   bash scripts/demo.sh --data-only   # the data path alone, 8 -> 4 -> 2 groups (seconds)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/env.sh || exit 1
export PYTHONPATH="$root:$root/integrations/torchtitan:$root/integrations/megatron:$root/integrations/torchft${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
if [[ "${1:-}" == "--data-only" ]]; then
  shift
  exec "$ZEPHON_PY" -m zephon_core.cli.demo "$@"
fi
exec "$ZEPHON_PY" scripts/demo_torchtitan.py "$@"
