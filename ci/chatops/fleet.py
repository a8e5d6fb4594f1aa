"""The runner labels ChatOps may dispatch a rerun to: the fleet we know, and GitHub's hosted runner.

A test's runner label comes from its ``register_*_ci`` call in an unreviewed PR. A label no runner carries
(``99999-gpu-h100``) would queue its job until GitHub drops it, with the reply saying "queued" all along, so
a label outside the fleet is refused before anything is dispatched. The fleet is ``ci/nightly/fleet.json``
(runners per label, which the nightly's sharding reads too): a label is written there once, for both.
"""

from __future__ import annotations

from pathlib import Path

from dspark_ci.ci.chatops.sglang_registrations import CPU_RUNNER, CUDA_LEGACY_SUITES, CUDA_RUNNER_CONFIGS
from dspark_ci.ci.nightly.shards import read_json_numbers
from dspark_ci.ground.errors import BadInput

DEFAULT_FLEET = Path(__file__).resolve().parent.parent / "nightly" / "fleet.json"
HOSTED_RUNNERS = frozenset({CPU_RUNNER})  # GitHub's own: always there
# The labels SGLang's own CI maps its runner configs to (scripts/ci/runner_configs.yml): runners that exist for a
# registered test's rerun, though the nightly does not shard onto them.
SGLANG_RUNNERS = frozenset(CUDA_RUNNER_CONFIGS.values()) | frozenset(CUDA_LEGACY_SUITES.values())
FLEET_FIX = 'give a JSON object of runner label -> runners, e.g. {"8-gpu-h200": 4} (ci/nightly/fleet.json)'


def load_fleet(path: Path | None = None, shown: str = "--fleet") -> frozenset[str]:
    """Every runner label a rerun may be dispatched to: ``path``'s (a fleet of one's own) and GitHub's hosted
    runner; by default ci/nightly/fleet.json's and the labels SGLang's own CI runs registered tests on."""
    given = path is not None
    path = path or DEFAULT_FLEET
    if not path.is_file():
        raise BadInput(shown, f"{path} is not a file", FLEET_FIX)
    labels = frozenset(label for label, runners in read_json_numbers(path, "fleet file").items() if runners > 0)
    return labels | HOSTED_RUNNERS | (frozenset() if given else SGLANG_RUNNERS)
