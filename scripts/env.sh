#!/usr/bin/env bash
# Build (once) and locate the project environment: a shared venv, and this clone's view of it.
#
# The shared venv holds the pinned packages (~6 GB). It lives outside the clone, keyed by a
# hash of the pins and the interpreter version, so every clone, CI run and later session on
# this machine shares it; a fresh machine builds it from scratch (~10 minutes). The project is
# never installed into it.
#
# Each clone gets its own small venv, .zephon-env/venv in the clone (a few seconds to make):
# it sees the shared venv's packages, has this clone installed editable, and its bin/ holds
# the shared venv's commands rewritten to run its own python. So `zephon`, `python`,
# `torchrun` and the adapters' entry points (zephon.state_readers) are this clone's, and
# sourcing this in another clone never changes what this one runs.
#
#   source scripts/env.sh     -> exports ZEPHON_VENV (this clone's venv), ZEPHON_PY (its python),
#                                ZEPHON_SHARED_VENV, ZEPHON_TT022 and activates this clone's venv:
#                                its bin/ goes first on PATH (zephon, python, torchrun)
#   bash scripts/env.sh       -> builds what is missing and prints this clone's venv
#
# Either works from any directory. Each part is built under a lock and marked complete last,
# so a build that failed or was interrupted is redone on the next run; this clone's venv is
# rebuilt when the shared one, the clone's path, its packaging (pyproject.toml, setup.py) or
# this script changes. Sourcing leaves the caller's shell options as they were.

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

# _zephon_once LOCK MARK STAMP CMD...: unless MARK holds STAMP, run CMD holding LOCK, then write
# STAMP to MARK. One builder at a time; the others wait and find it done.
_zephon_once() {
  local lock="$1" mark="$2" stamp="$3" fd rc=0
  shift 3
  [[ -f "$mark" && "$(cat "$mark")" == "$stamp" ]] && return 0
  mkdir -p "$(dirname "$lock")" && exec {fd}>"$lock" && flock "$fd" || return 1
  if [[ ! -f "$mark" || "$(cat "$mark")" != "$stamp" ]]; then
    "$@" && printf '%s\n' "$stamp" >"$mark" || rc=1
  fi
  exec {fd}>&-
  return "$rc"
}

_zephon_build_shared() {  # _zephon_build_shared PY VENV TT022
  local py="$1" venv="$2" tt022="$3"
  echo "zephon: building the environment in $venv (first run only, ~10 min)" >&2
  rm -rf "$venv"
  "$py" -m venv "$venv" \
    && "$venv/bin/python" -m pip install --quiet --upgrade pip \
    && "$venv/bin/python" -m pip install --quiet -r "$_zephon_root/requirements/env.txt" \
    && "$venv/bin/python" -m pip install --quiet --no-deps -r "$_zephon_root/requirements/formats.txt" \
    && "$venv/bin/python" -m pip install --quiet --no-deps --target "$tt022" \
      -r "$_zephon_root/requirements/torchtitan-0.2.txt" \
    || { echo "zephon: building the environment failed" >&2; return 1; }
}

_zephon_build_clone_venv() {  # _zephon_build_clone_venv SHARED VENV
  local shared="$1" venv="$2" site shared_site f name line
  rm -rf "$venv"
  "$shared/bin/python" -m venv --without-pip "$venv" || return 1
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || return 1
  shared_site="$("$shared/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || return 1
  # The shared packages come after this venv's own. Clones set up before the per-clone venvs
  # installed themselves into the shared venv (and older scripts still do): its zephon_suite
  # .pth files are skipped, and this venv's own distribution is found first.
  cat >"$site/_zephon_shared.py" <<PY || return 1
"""Written by scripts/env.sh: this clone's venv sees the shared environment's packages."""
import os
import site
import sys

SHARED = ${shared_site@Q}
if SHARED not in sys.path:
    sys.path.append(SHARED)
    for name in sorted(os.listdir(SHARED)):
        if name.endswith(".pth") and not name.startswith(("__editable__.zephon_suite", "zephon_suite")):
            site.addpackage(SHARED, name, None)
PY
  echo "import _zephon_shared" >"$site/_zephon_shared.pth" || return 1
  # --ignore-installed: pip must not touch the shared venv's zephon-suite, if a clone left one.
  env -u PYTHONPATH "$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation --ignore-installed \
    --editable "$_zephon_root" >"$venv/pip.log" 2>&1 \
    || { echo "zephon: installing the project into $venv failed (see $venv/pip.log)" >&2; return 1; }
  # The shared commands, run by this venv's python (a venv's scripts name their python), or
  # linked where they are not Python (ruff, mpiexec); the shared libraries (mpi4py finds MPICH's
  # under the venv's lib/) and the torchtitan 0.2.2 folder, linked. Never linked over a file this
  # venv has: writing through a link would change the shared venv.
  for f in "$shared"/bin/*; do
    name="${f##*/}"
    [[ -e "$venv/bin/$name" || -d "$f" || "$name" == activate* || "$name" == Activate.ps1 ]] && continue
    IFS= read -r line <"$f" 2>/dev/null || line=""
    if [[ "$line" == "#!$shared/bin/python"* ]]; then
      # The form pip writes for a long python path: a shell line that re-runs the file in it.
      { echo '#!/bin/sh'; echo "'''exec' \"$venv/bin/python\" \"\$0\" \"\$@\""; echo "' '''"; tail -n +2 "$f"; } \
        >"$venv/bin/$name" && chmod +x "$venv/bin/$name" || return 1
    else
      ln -s "$f" "$venv/bin/$name" || return 1
    fi
  done
  for f in "$shared"/lib/*; do
    [[ -e "$venv/lib/${f##*/}" ]] || ln -s "$f" "$venv/lib/${f##*/}" || return 1
  done
  [[ ! -e "$shared/torchtitan-0.2.2" ]] || ln -s "$shared/torchtitan-0.2.2" "$venv/torchtitan-0.2.2"
}

_zephon_activate() {  # _zephon_activate VENV: its bin/ first on PATH, once; a previously active venv's off it
  local p=":$PATH:" dir
  for dir in "$1/bin" ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin"}; do
    while [[ "$p" == *":$dir:"* ]]; do p="${p//":$dir:"/:}"; done
  done
  p="${p#:}"
  export VIRTUAL_ENV="$1" PATH="$1/bin${p:+:${p%:}}"
}

_zephon_build_env() {
  local py key home shared tt022 venv stamp
  py="$(_zephon_find_python312)" || return 1
  key="$( { cat "$_zephon_root"/requirements/*.txt; "$py" -VV; } | sha256sum | cut -c1-16)"
  home="${ZEPHON_ENV_HOME:-$HOME/.cache/zephon-env}"
  shared="$home/py312-$key"
  tt022="$shared/torchtitan-0.2.2"
  _zephon_once "$home/.lock-$key" "$shared/.complete" "" _zephon_build_shared "$py" "$shared" "$tt022" || return 1
  venv="$_zephon_root/.zephon-env/venv"
  stamp="$shared $_zephon_root $(cd "$_zephon_root" && cat pyproject.toml setup.py scripts/env.sh | sha256sum | cut -c1-16)"
  _zephon_once "$_zephon_root/.zephon-env/lock" "$venv/.complete" "$stamp" _zephon_build_clone_venv "$shared" "$venv" \
    || return 1
  export ZEPHON_VENV="$venv" ZEPHON_PY="$venv/bin/python" ZEPHON_SHARED_VENV="$shared" ZEPHON_TT022="$tt022"
  _zephon_activate "$venv"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  _zephon_build_env || exit 1
  echo "$ZEPHON_VENV"
else
  _zephon_build_env || return 1
fi
