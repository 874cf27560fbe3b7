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
#   s3rver:  ~/.cache/zephon-env/s3rver-<hash> from zephon_dev/s3rver/package-lock.json (npm ci; needs node >= 16 and npm)
#            plus zephon_dev/s3rver/atomic-put.patch: the P4 benchmark's second loopback S3-compatible server, beside moto;
#            skipped (with a note) without node.
# Results: bench/results/results.{json,md}, bench/results/profile_*.txt, plots in docs/img/perf_*.png (the reference
#          run: every default goal, full windows); --only / --quick runs: bench/results/partial/<goals>[-quick]/.
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

# cached DIR WHAT BUILD: run "BUILD DIR" once for DIR (one builder at a time, under a lock beside it);
# a build that fails is never marked complete. Fails when DIR is not complete afterwards.
cached() {
  local dir="$1" what="$2" build="$3"
  if [[ ! -f "$dir/.complete" ]]; then
    mkdir -p "$(dirname "$dir")"
    exec 9>"$(dirname "$dir")/.lock-$(basename "$dir")"
    flock 9
    if [[ ! -f "$dir/.complete" ]]; then
      echo "bench: building $what in $dir (first run only)" >&2
      rm -rf "$dir"
      mkdir -p "$dir"
      if "$build" "$dir"; then touch "$dir/.complete"; else echo "bench: building $what failed" >&2; fi
    fi
    exec 9>&-
  fi
  [[ -f "$dir/.complete" ]]
}

build_peers() {  # ~3 min
  "$py" -m venv "$1" \
    && "$1/bin/python" -m pip install --quiet --upgrade pip \
    && "$1/bin/python" -m pip install --quiet -r bench/requirements-peers.txt
}

build_s3rver() {  # ~20 s; atomic-put.patch: a PUT replaces an object at once, as on S3 (s3rver writes in place)
  cp zephon_dev/s3rver/package.json zephon_dev/s3rver/package-lock.json "$1/" \
    && (cd "$1" && npm ci --no-audit --no-fund --loglevel=error >&2) \
    && git -C "$1/node_modules/s3rver" apply -p1 "$root/zephon_dev/s3rver/atomic-put.patch"
}

py="$(find_python312)"
home="${ZEPHON_ENV_HOME:-$HOME/.cache/zephon-env}"
key="$( { cat bench/requirements-peers.txt; "$py" -VV; } | sha256sum | cut -c1-16)"
peers="$home/peers-py312-$key"
cached "$peers" "the peers environment" build_peers || exit 1

# The P4 benchmark's loopback S3 server besides moto (a real one, not moto's Python): s3rver from npm.
s3rver_args=()
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  skey="$( { cat zephon_dev/s3rver/package-lock.json zephon_dev/s3rver/atomic-put.patch; node --version; } | sha256sum | cut -c1-16)"
  if cached "$home/s3rver-$skey" "s3rver" build_s3rver; then
    s3rver_args=(--s3rver "$home/s3rver-$skey/node_modules/s3rver/bin/s3rver.js")
  else
    echo "bench: P4 runs without s3rver" >&2
  fi
else
  echo "bench: node/npm not found; P4 runs without s3rver" >&2
fi

exec "$ZEPHON_PY" bench/run.py --project-python "$ZEPHON_PY" --peers-python "$peers/bin/python" "${s3rver_args[@]}" "$@"
