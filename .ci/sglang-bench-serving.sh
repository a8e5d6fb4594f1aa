#!/usr/bin/env bash
# SGLang 0.5.23's own bench_serving (python -m sglang.benchmark.serving) on the CPU: the resolver venv
# (.ci/sglang-resolver.sh) plus the packages only bench_serving needs (.ci/sglang-bench-serving.txt).
# Prints the interpreter's path. bench/sglang_bench_serving.py and tests/test_bench_serving_side.py use it
# (DSPARK_SGLANG_PYTHON).
# Usage: bash .ci/sglang-bench-serving.sh [VENV_DIR]   (default .cache/sglang-venv; kept when already complete)
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(bash .ci/sglang-resolver.sh "${1:-.cache/sglang-venv}")
extra=.ci/sglang-bench-serving.txt
# Complete when every requirement of the file is installed at a version it allows (no resolver run: ~0.2 s).
if "$python" .ci/requirements-met.py "$extra"; then
  echo "$python"; exit 0
fi
"$python" -m pip install -q --disable-pip-version-check -r "$extra" >&2
echo "$python"
