#!/usr/bin/env bash
# The demo: an elastic run on CPU (8 -> 4 -> 2 data-parallel groups), checked
# step by step against an uninterrupted run. Builds the environment on first use.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/env.sh
export PYTHONPATH="$root:$root/integrations/torchtitan:$root/integrations/megatron${PYTHONPATH:+:$PYTHONPATH}"
exec "$ZEPHON_PY" -m zephon_core.demo "$@"
