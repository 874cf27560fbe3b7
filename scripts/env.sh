#!/usr/bin/env bash
# Build (once) and locate the project environment.
#
# The venv lives outside the clone, keyed by a hash of the pins and the
# interpreter version, so every clone, CI run and later session on this machine
# shares it; a fresh machine builds it from scratch (~6 GB, ~10 minutes).
#
#   source scripts/env.sh     -> exports ZEPHON_VENV, ZEPHON_PY, ZEPHON_TT022 and activates the
#                                env: its bin/ goes first on PATH (zephon, python, torchrun)
#   bash scripts/env.sh       -> builds it if missing and prints its path
#
# The project itself is installed editable into it from this clone (re-pointed when
# another clone sources this), so `zephon` is on the venv's PATH and the adapters'
# entry points (zephon.state_readers) are visible.
#
# Sourcing leaves the caller's shell options as they were.

_zephon_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

_zephon_find_python312() {
  if [[ -n "${ZEPHON_PYTHON:-}" ]]; then echo "$ZEPHON_PYTHON"; return; fi
  local cand
  for cand in python3.12 "$(command -v pyenv >/dev/null 2>&1 && echo "$(pyenv root)")"/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if [[ -x "$(command -v "$cand" 2>/dev/null || echo "$cand")" ]] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$cand" 2>/dev/null || echo "$cand"; return
    fi
  done
  echo "error: Python 3.12 not found (megatron-core >= 0.17 needs it); set ZEPHON_PYTHON" >&2
  return 1
}

_zephon_build_env() {
  local py key home venv tt022 log
  py="$(_zephon_find_python312)" || return 1
  key="$( { cat "$_zephon_root"/requirements/*.txt; "$py" -VV; } | sha256sum | cut -c1-16)"
  home="${ZEPHON_ENV_HOME:-$HOME/.cache/zephon-env}"
  venv="$home/py312-$key"
  tt022="$venv/torchtitan-0.2.2"
  if [[ ! -f "$venv/.complete" ]]; then
    mkdir -p "$home"
    # One builder at a time; a half-built venv is never marked complete.
    exec 9>"$home/.lock-$key"
    flock 9
    if [[ ! -f "$venv/.complete" ]]; then
      echo "zephon: building the environment in $venv (first run only, ~10 min)" >&2
      rm -rf "$venv"
      "$py" -m venv "$venv" \
        && "$venv/bin/python" -m pip install --quiet --upgrade pip \
        && "$venv/bin/python" -m pip install --quiet -r "$_zephon_root/requirements/env.txt" \
        && "$venv/bin/python" -m pip install --quiet --no-deps --target "$tt022" -r "$_zephon_root/requirements/torchtitan-0.2.txt" \
        && touch "$venv/.complete" \
        || { echo "zephon: building the environment failed" >&2; exec 9>&-; return 1; }
    fi
    exec 9>&-
  fi
  _zephon_install_project "$venv" || return 1
  export ZEPHON_VENV="$venv" ZEPHON_PY="$venv/bin/python" ZEPHON_TT022="$tt022" VIRTUAL_ENV="$venv"
  case ":$PATH:" in
    *":$venv/bin:"*) ;;
    *) export PATH="$venv/bin:$PATH" ;;
  esac
}

_zephon_install_project() {
  local venv="$1" mark="$1/.editable-root"
  [[ "$(cat "$mark" 2>/dev/null)" == "$_zephon_root" ]] && return 0
  exec 8>"$venv/.editable-lock"
  flock 8
  if [[ "$(cat "$mark" 2>/dev/null)" != "$_zephon_root" ]]; then
    "$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation --editable "$_zephon_root" >/dev/null 2>&1 \
      && echo "$_zephon_root" >"$mark" \
      || { echo "zephon: installing the project into $venv failed" >&2; exec 8>&-; return 1; }
  fi
  exec 8>&-
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  _zephon_build_env || exit 1
  echo "$ZEPHON_VENV"
else
  _zephon_build_env || return 1
fi
