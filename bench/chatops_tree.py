"""How long `dspark-ci chatops` takes to answer a hostile `/rerun-test` over a large PR tree.

    python bench/chatops_tree.py [--files 10000] [--file-kb 8] [--repeats 3] [--code DIR]

Builds a fake SGLang checkout with ``--files`` registered test files (100 per folder, each about
``--file-kb`` kB of Python like SGLang's test files: a registration, then test methods) in a temporary
directory, then runs the console command as the ChatOps workflow would (``python -m dspark_ci chatops
--comment ... --dry-run``, a fresh process each time, so interpreter start-up is included) for each
comment below, ``--repeats`` times. Prints min / median / max wall seconds and the exit code per comment.
``--code`` runs another checkout of dspark-ci (e.g. ``git worktree add /tmp/old <commit>``) for a
before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PERMISSIONS = {"maintainer": {"can_tag_run_ci_label": True, "can_rerun_failed_ci": True,
                              "cooldown_interval_minutes": 0}}
COMMENTS = {
    "every cell (`*`)": "/rerun-test *",
    "every cell (`cell:*`)": "/rerun-test cell:*",
    "20 folder globs": "/rerun-test " + " ".join(f"registered/area{i:03d}/test_*.py" for i in range(20)),
    "20 bare-name globs": "/rerun-test " + " ".join(f"test_case_{i:02d}*.py" for i in range(20)),
    "10 files, accepted": "/rerun-test registered/area000/test_case_00?.py",
}


def build_tree(root: Path, files: int, file_kb: int = 8) -> None:
    method = "    def test_case_{0}(self):\n        result = run_eval(self.base_url, num_examples=64)\n" \
             "        self.assertGreater(result['score'], 0.{0})\n\n"
    body = "".join(method.format(i) for i in range(file_kb * 1024 // len(method.format(0))))
    text = ('import unittest\n\nfrom sglang.test.ci.ci_register import register_cuda_ci\n\n'
            'register_cuda_ci(est_time=300, suite="nightly-1-gpu")\n\n\nclass TestCase(unittest.TestCase):\n' + body)
    for index in range(files):
        folder = root / "test/registered" / f"area{index // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"test_case_{index % 100:03d}.py").write_text(text)


def time_comment(code: Path, root: Path, permissions: Path, comment: str) -> tuple[float, int]:
    argv = [sys.executable, "-m", "dspark_ci", "chatops", "--comment", comment, "--user", "maintainer",
            "--author-association", "MEMBER", "--repo-root", str(root), "--permissions", str(permissions),
            "--pr", "1", "--repo", "o/n", "--dry-run", "--format", "json"]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=code, capture_output=True, text=True, timeout=900,
                          env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"})
    return time.monotonic() - started, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--file-kb", type=int, default=8, help="size of each test file (kB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--code", type=Path, default=REPO, help="the dspark-ci checkout to run (default this one)")
    parser.add_argument("--smoke", action="store_true", help="CI's check that the bench still runs: 100 files, once")
    args = parser.parse_args()
    if args.smoke:
        args.files, args.repeats = 100, 1
    with tempfile.TemporaryDirectory(prefix="chatops-tree-") as tmp:
        root = Path(tmp) / "sglang"
        build_tree(root, args.files, args.file_kb)
        permissions = Path(tmp) / "permissions.json"
        permissions.write_text(json.dumps(PERMISSIONS))
        print(f"{args.files} test files of {args.file_kb} kB, {args.repeats} repeats, code: {args.code}")
        print("| comment | exit | min s | median s | max s |\n|---|---|---|---|---|")
        for name, comment in COMMENTS.items():
            runs = [time_comment(args.code, root, permissions, comment) for _ in range(args.repeats)]
            seconds = [s for s, _ in runs]
            codes = sorted({c for _, c in runs})
            print(f"| {name} | {','.join(map(str, codes))} | {min(seconds):.2f} | {statistics.median(seconds):.2f} "
                  f"| {max(seconds):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
