"""Every test, and every process a test starts, keeps its state (run index, run history) in a directory of
this session: `python3 -m pytest tests` never adds a run to the user's history or index.

The user's own locations, as they were before the session changed them, are ``USER_STATE_DIR`` and
``USER_HISTORY`` (tests/test_own_state.py proves a run started by a test leaves them alone).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.sglang.resolver import locate
from dspark_ci.ground.state import STATE_DIR_ENV, state_dir
from dspark_ci.reports.history_db import HISTORY_ENV, history_path

# Tests of what this machine has one of run on one xdist worker per group, one after the other, as they would
# without xdist: a capacity, placement or leftover check they make is theirs alone. The Slurm cluster's four nodes
# and the two Docker engines are one group (several files use both; the Docker interrupt tests failed in a run that
# had them beside the Slurm files' Docker tests, and passed alone), the API server another, SGLang's real engine
# (both cores at boot) a third.
SHARED = {
    "clusters": ("test_slurm_launcher.py", "test_cells_side_by_side.py", "test_pd.py", "test_launcher_compliance.py",
                 "test_amd_placement.py", "test_docker_hosts.py", "test_docker_launcher.py"),
    "kubernetes": ("test_k8s_launcher.py",),
    "real-engine": ("test_engine_conformance.py", "test_engine_run.py", "test_cleanup_groups.py"),
}
# Modules whose tests share one costly module-scoped fixture (three CLI runs, a front end's boot, a conversion check):
# xdist spreads a module's tests over the workers, and each worker set the fixture up again (test_gates_cli's three
# runs twice, 283 s and 265 s of setup). Grouped, it is set up once.
ONE_SETUP = ("test_gates_cli.py", "test_frontend_conformance.py", "test_frontend_io_struct.py", "test_real_model.py",
             "test_bench_serving_side.py", "test_cpu_kernels.py")
GROUP_OF = {**{name: name.removesuffix(".py") for name in ONE_SETUP},
            **{name: group for group, names in SHARED.items() for name in names}}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the group mark into the scheduling key
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = GROUP_OF.get(item.path.name) or ("clusters" if item.get_closest_marker("docker") else None)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


USER_STATE_DIR: Path = state_dir(os.environ)
USER_HISTORY: Path = history_path(os.environ)


@pytest.fixture(scope="session", autouse=True)
def own_state(tmp_path_factory) -> Path:
    """DSPARK_STATE_DIR and DSPARK_HISTORY of this session, in os.environ (subprocesses inherit it); a test that
    sets its own (tmp_path / "state") still wins for what it starts. Also one OpenMP thread per process unless the
    caller set a count: the xdist workers already share the cores, and a torch process (SGLang's front end, the
    model conversion check, the kernel checks) with a thread per core stalls at every barrier for a thread that lost
    its core (2-3 times slower beside one busy process, measured on the engine)."""
    root = tmp_path_factory.mktemp("dspark-state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STATE_DIR_ENV, str(root))
        patch.setenv(HISTORY_ENV, str(root / "history.sqlite"))
        patch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        yield root


@pytest.fixture(scope="session")
def sglang_python():
    """The interpreter of SGLang's resolver venv (preflight, resolver-decided rejections); skipped without it."""
    try:
        return locate("local").python
    except InfraError as err:
        pytest.skip(f"SGLang's resolver is not installed here: {err}")

