"""The simulator's argparse errors are SGLang's own, byte for byte: what a launcher's log shows
for a mistyped flag must read as real SGLang's would. Compared with the pinned SGLang release's parser itself, run
in its resolver venv ($DSPARK_SGLANG_PYTHON, `bash .ci/sglang-resolver.sh`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SGLANG_PYTHON = os.environ.get("DSPARK_SGLANG_PYTHON")
REAL_PARSER = ("import sys; from sglang.srt.server_args import prepare_server_args; "
               "prepare_server_args(sys.argv[1:])")


@pytest.mark.skipif(not SGLANG_PYTHON, reason="no SGLang venv: bash .ci/sglang-resolver.sh, then export "
                    "DSPARK_SGLANG_PYTHON=.cache/sglang-venv/bin/python")
@pytest.mark.parametrize("argv", [
    ["--model-path", "m", "--prot", "30000"],
    ["--model-path", "m", "--tp-size", "eight"],
], ids=["unknown-flag", "bad-int"])
def test_the_simulators_argparse_error_line_is_sglangs(argv):
    real = subprocess.run([SGLANG_PYTHON, "-c", REAL_PARSER, *argv], capture_output=True, text=True, timeout=300)
    ours = subprocess.run([sys.executable, "-m", "dspark_ci.sglang_sim", *argv], capture_output=True, text=True,
                          timeout=60)
    assert real.returncode == ours.returncode == 2, real.stderr[-500:]
    assert ours.stderr.splitlines()[-1] == real.stderr.splitlines()[-1]
    assert "did you mean" not in ours.stderr
