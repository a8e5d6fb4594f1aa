#!/usr/bin/env bash
# SGLang 0.5.23's own HTTP front end (launch_server's FastAPI app, TokenizerManager, DetokenizerManager) on the
# CPU, in front of the simulated scheduler (`dspark-ci run --server sglang-frontend`, sglang_sim/frontend/): the
# resolver venv (.ci/sglang-resolver.sh) plus .ci/sglang-frontend.txt, installed --no-deps (about 100 MB).
# Prints the interpreter's path (DSPARK_SGLANG_PYTHON).
# Usage: bash .ci/sglang-frontend.sh [VENV_DIR]   (default .cache/sglang-venv; kept when already complete)
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(bash .ci/sglang-resolver.sh "${1:-.cache/sglang-venv}")
extra=.ci/sglang-frontend.txt
# Complete when every requirement of the file is installed at a version it allows (no resolver run: ~0.2 s).
if "$python" .ci/requirements-met.py "$extra"; then
  echo "$python"; exit 0
fi
"$python" -m pip install -q --disable-pip-version-check --no-deps -r "$extra" >&2
echo "$python"
