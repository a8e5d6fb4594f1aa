#!/usr/bin/env bash
# A virtual environment in which SGLang's own argument resolution runs without a GPU:
# sglang==0.5.23 without its dependencies, the CPU build of torch and the few packages its argument code imports
# (.ci/sglang-resolver.txt). Prints the interpreter's path. `dspark-ci preflight --sglang PYTHON` and
# tests/test_sim_conformance.py use it (DSPARK_SGLANG_PYTHON).
# Usage: bash .ci/sglang-resolver.sh [VENV_DIR]   (default .cache/sglang-venv; kept when already complete)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.cache/sglang-venv}
case $venv in /*) ;; *) venv=$PWD/$venv ;; esac  # an absolute VENV_DIR is printed as given
version=0.5.23
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import sglang.srt.server_args, torch" 2>/dev/null; then
  echo "$venv/bin/python"; exit 0
fi
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
wheel=$(ls /tmp/sg/sglang-$version-*.whl 2>/dev/null | head -1 || true)
"${pip[@]}" --no-deps "${wheel:-sglang==$version}" >&2
# torch==2.13.0 resolves to the CPU build held in the machine's wheel directory (pip's find-links).
"${pip[@]}" -r .ci/sglang-resolver.txt >&2
echo "$venv/bin/python"
