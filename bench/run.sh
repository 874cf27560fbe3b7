#!/usr/bin/env bash
# Zephon benchmarks side by side with peer loaders: one command, builds what it needs.
#
#   bash bench/run.sh            full run (~7-10 min on a 2-core machine, after the first build)
#   bash bench/run.sh --quick    smoke run (~2 min)
#   bash bench/run.sh --only P1,P3
#
# Environments (built once, reused, keyed by a hash of their pins and the interpreter):
#   project: scripts/env.sh (zephon_core's own venv: tokenizers, numpy, torch + torchdata, megatron-core, s3fs, moto, psutil)
#   peers:   ~/.cache/zephon-env/peers-py312-<hash> from bench/requirements-peers.txt
#            (zephon 0.2.0 from PyPI, grain, matplotlib, py-spy); never installed into the project venv.
# Results: bench/results/results.{json,md}, bench/results/profile_*.txt, plots in docs/img/perf_*.png.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# shellcheck source=../scripts/env.sh
source scripts/env.sh

find_python312() {
  if [[ -n "${ZEPHON_PYTHON:-}" ]]; then echo "$ZEPHON_PYTHON"; return; fi
  local cand
  for cand in python3.12 "$(command -v pyenv >/dev/null 2>&1 && pyenv root)"/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if [[ -x "$(command -v "$cand" 2>/dev/null || echo "$cand")" ]] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$cand" 2>/dev/null || echo "$cand"; return
    fi
  done
  echo "error: Python 3.12 not found; set ZEPHON_PYTHON" >&2
  return 1
}

py="$(find_python312)"
key="$( { cat bench/requirements-peers.txt; "$py" -VV; } | sha256sum | cut -c1-16)"
home="${ZEPHON_ENV_HOME:-$HOME/.cache/zephon-env}"
peers="$home/peers-py312-$key"
if [[ ! -f "$peers/.complete" ]]; then
  mkdir -p "$home"
  exec 9>"$home/.lock-peers-$key"
  flock 9
  if [[ ! -f "$peers/.complete" ]]; then
    echo "bench: building the peers environment in $peers (first run only, ~3 min)" >&2
    rm -rf "$peers"
    "$py" -m venv "$peers"
    "$peers/bin/python" -m pip install --quiet --upgrade pip
    "$peers/bin/python" -m pip install --quiet -r bench/requirements-peers.txt
    touch "$peers/.complete"
  fi
  exec 9>&-
fi

exec "$ZEPHON_PY" bench/run.py --project-python "$ZEPHON_PY" --peers-python "$peers/bin/python" "$@"
