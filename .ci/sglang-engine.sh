#!/usr/bin/env bash
# SGLang 0.5.23's real engine on the CPU (`dspark-ci run --server sglang-engine`, sglang_sim/cpu_engine/): the front
# end's venv (.ci/sglang-frontend.sh, on the resolver's) plus .ci/sglang-engine.txt, installed --no-deps, and g++
# for NGRAM's just-in-time n-gram corpus. Prints the interpreter's path (DSPARK_SGLANG_ENGINE_PYTHON).
# Usage: bash .ci/sglang-engine.sh [VENV_DIR]   (default .cache/sglang-venv; kept when already complete)
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(bash .ci/sglang-frontend.sh "${1:-.cache/sglang-venv}")
extra=.ci/sglang-engine.txt
if ! command -v g++ >/dev/null; then
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends g++ >&2
fi
if "$python" .ci/requirements-met.py "$extra"; then
  echo "$python"; exit 0
fi
"$python" -m pip install -q --disable-pip-version-check --no-deps -r "$extra" >&2
echo "$python"
