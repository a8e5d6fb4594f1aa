"""Exit 0 when every requirement of the file (argv[1]) is installed at a version it allows, else 1. No resolver run
(~0.2 s): .ci/sglang-bench-serving.sh and .ci/sglang-frontend.sh use it to keep a complete venv as it is."""

import importlib.metadata as metadata
import sys

from packaging.requirements import Requirement

for line in open(sys.argv[1]):
    line = line.split(" --hash", 1)[0].split("#", 1)[0].strip()  # a pinned hash is pip's to check on install
    if not line:
        continue
    requirement = Requirement(line)
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        sys.exit(1)
    if not requirement.specifier.contains(version, prereleases=True):
        sys.exit(1)
