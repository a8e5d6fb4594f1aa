"""``python -m dspark_ci.ci.chatops.run_tests --dir pr/test``: run the tests a /rerun-test dispatch names, exactly.

The rerun workflow hands over the ``tests`` input in ``$RERUN_TESTS``: a JSON list of argv lists, as
ChatOps resolved them (``[["registered/spec/test_x.py", "TestX.test_y"], ...]``). Each list runs as
``python3 ARGV...`` inside the test directory, with no shell in between, after every word is checked
again against the names ChatOps may dispatch (a hand-made dispatch gets no further than ChatOps would).
Exit 0 when every test passed, 1 when one failed, 2 when the input is not such a list.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from dspark_ci.ci.chatops.resolve_test_paths import SAFE_PATH
from dspark_ci.ci.tool import run_tool
from dspark_ci.ground.errors import BadInput

SELECTOR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")
FIX = 'give a JSON list of argv lists, e.g. [["registered/spec/test_x.py", "TestX.test_y"]]'


def parse_tests(text: str) -> list[list[str]]:
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadInput("RERUN_TESTS", f"not valid JSON ({err.msg})", FIX) from None
    if not isinstance(tests, list) or not tests:
        raise BadInput("RERUN_TESTS", "not a non-empty list", FIX)
    for argv in tests:
        ok = (isinstance(argv, list) and 1 <= len(argv) <= 2 and all(isinstance(w, str) for w in argv)
              and SAFE_PATH.fullmatch(argv[0]) and argv[0].startswith("registered/") and ".." not in argv[0]
              and argv[0].endswith(".py") and (len(argv) == 1 or SELECTOR.fullmatch(argv[1])))
        if not ok:
            raise BadInput("RERUN_TESTS", f"{json.dumps(argv)[:200]} is not a registered test file and selector",
                           FIX)
    return tests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_ci.ci.chatops.run_tests",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="the test directory of the code under test")
    parser.add_argument("--python", default="python3", help="interpreter the tests run with (default python3)")
    args = parser.parse_args(argv)

    def body() -> int:
        tests = parse_tests(os.environ.get("RERUN_TESTS", ""))
        status = 0
        for words in tests:
            print(f"::group::python3 {' '.join(words)}", flush=True)
            status |= subprocess.run([args.python, *words], cwd=args.dir).returncode != 0
            print("::endgroup::", flush=True)
        return int(status)

    return run_tool("dspark_ci.ci.chatops.run_tests", body)


if __name__ == "__main__":
    sys.exit(main())
