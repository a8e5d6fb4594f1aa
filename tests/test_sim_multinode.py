"""Multi-node start-up and failure: rank 0 is healthy only once every rank has joined it; a rank
that goes away takes the group down with an error line (what an NCCL failure looks like)."""

from __future__ import annotations

import time

import pytest
import requests

from tests.sim_fixtures import free_port, sim  # noqa: F401 (sim is a fixture)


def node_args(nnodes: int, rank: int, dist_port: int) -> list[str]:
    return ["--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", f"127.0.0.1:{dist_port}",
            "--tp-size", str(8 * nnodes)]


def wait_for(predicate, timeout_s: float = 60.0) -> bool:  # a deadline for a hung test, not a bound
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def ports():
    """One API port shared by every node rank (each binds its own 127.0.0.(r+1)), and the dist port."""
    return free_port("127.0.0.1"), free_port("127.0.0.1")


def test_rank0_is_healthy_only_after_every_rank_joined(sim, ports):
    port, dist = ports
    rank0 = sim(node_args(3, 0, dist), host="127.0.0.1", port=port, wait=False)
    assert wait_for(lambda: rank0.health() == 503)
    rank1 = sim(node_args(3, 1, dist), host="127.0.0.2", port=port, wait=False)
    assert wait_for(lambda: rank1.health() == 200)  # a dummy health server: says nothing about the group
    assert wait_for(lambda: "Node rank 1 joined (1/2 other ranks)" in rank0.log())  # rank 0 has counted it
    assert rank0.health() == 503  # rank 2 is still missing
    sim(node_args(3, 2, dist), host="127.0.0.3", port=port, wait=False)
    assert wait_for(lambda: rank0.health() == 200)
    reply = requests.post(rank0.url("/v1/chat/completions"), timeout=10, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).json()
    assert reply["usage"]["completion_tokens"] <= 3
    assert requests.get(rank1.url("/v1/models"), timeout=5).status_code == 404  # only rank 0 serves the API


def test_a_rank_joining_before_rank0_waits_for_it(sim, ports):
    port, dist = ports
    rank1 = sim(node_args(2, 1, dist), host="127.0.0.2", port=port, wait=False)
    assert wait_for(lambda: rank1.health() == 200)
    rank0 = sim(node_args(2, 0, dist), host="127.0.0.1", port=port, wait=False)
    assert wait_for(lambda: rank0.health() == 200)


def test_rank0_dies_when_another_rank_goes_away(sim, ports):
    port, dist = ports
    rank0 = sim(node_args(2, 0, dist), host="127.0.0.1", port=port, wait=False)
    rank1 = sim(node_args(2, 1, dist), host="127.0.0.2", port=port, wait=False)
    assert wait_for(lambda: rank0.health() == 200)
    rank1.process.kill()
    assert rank0.wait_exit() != 0
    assert rank0.last_line().startswith("RuntimeError: ") and "node rank 1" in rank0.last_line()


def test_other_ranks_die_when_rank0_goes_away(sim, ports):
    port, dist = ports
    rank0 = sim(node_args(2, 0, dist), host="127.0.0.1", port=port, wait=False)
    rank1 = sim(node_args(2, 1, dist), host="127.0.0.2", port=port, wait=False)
    assert wait_for(lambda: rank0.health() == 200)
    rank0.process.kill()
    assert rank1.wait_exit() != 0
    assert rank1.last_line().startswith("RuntimeError: ") and "node rank 0" in rank1.last_line()


def test_rank_exit_fault_takes_the_whole_group_down(sim, ports):
    port, dist = ports
    env = {"DSPARK_SIM_FAULTS": "rank_exit=1:1"}
    rank0 = sim(node_args(2, 0, dist), env=env, host="127.0.0.1", port=port, wait=False)
    rank1 = sim(node_args(2, 1, dist), env=env, host="127.0.0.2", port=port, wait=False)
    assert rank1.wait_exit() != 0
    assert "rank_exit" in rank1.last_line()
    assert rank0.wait_exit() != 0
    assert "node rank 1" in rank0.last_line()
