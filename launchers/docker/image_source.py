"""Which code the simulator's image was built from. The image carries a digest of the packages the simulated
server runs (``SIM_PACKAGES``) as a label; a launch compares it with the code of the dspark-ci that launches, so
a run never measures a simulator older (or newer) than the tree it reports for: an image left from an earlier
checkout is the wrong commit, however healthy it looks."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

SOURCE_LABEL = "dspark-ci.source"
IMAGE_KIND_LABEL, SIM_IMAGE_KIND = "dspark-ci.image", "sglang-sim"  # docker/Dockerfile's label: any tag of it
# What `python3 -m dspark_ci.sglang_sim` imports from this project: the simulator and the floor (its SGLang facts
# included).
SIM_PACKAGES = ("sglang_sim", "ground")


def sim_source_digest() -> str:
    """A digest of every file of ``SIM_PACKAGES`` as this interpreter finds them (bytecode caches left out)."""
    digest = hashlib.sha256()
    for package in SIM_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"package {package} not found")
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(f"{package}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


if __name__ == "__main__":  # docker/build-sim-image.sh labels the image with it
    print(sim_source_digest())
