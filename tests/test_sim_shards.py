"""DSPARK_SIM_SHARDS: one server as several engine processes on one port. Clients see one server: /metrics,
/server_info and the emission log add up across the shards, faults still take the server down, and no shard
outlives the server however it is stopped."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import psutil
import pytest
import requests
from dspark_ci.ground.processes import RUN_ENV, group_members
from prometheus_client.parser import text_string_to_metric_families

from tests.sim_fixtures import run_sim_to_exit, sim  # noqa: F401 (fixture)

SPEC_ARGS = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft",
             "--speculative-dspark-block-size", "3"]
TWO_RANKS = ["--tp-size", "2", "--dp-size", "2"]
SHARDED = {"DSPARK_SIM_SHARDS": "2", "DSPARK_SIM_DECODE_STEP_MS": "5"}
STREAMS, TOKENS = 48, 12


def shard_processes(server) -> list[psutil.Process]:
    return psutil.Process(server.process.pid).children()


def gone(processes: list[psutil.Process], timeout_s: float = 10.0) -> bool:
    """Every process ended (an orphaned zombie waiting for a reaper counts as ended: it runs nothing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = []
        for proc in processes:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


async def stream_all(url: str) -> list[tuple[str, int]]:
    """STREAMS concurrent streamed chats, each on its own connection (so the kernel spreads them over the shards):
    (response id, content chunks) each."""
    async def one(index: int) -> tuple[str, int]:
        body = {"model": "m", "messages": [{"role": "user", "content": f"story {index}"}], "stream": True,
                "max_tokens": TOKENS, "ignore_eos": True}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                rid, chunks = "", 0
                async for line in response.content:
                    if line.startswith(b"data: {"):
                        event = json.loads(line[6:])
                        rid = event["id"]
                        chunks += any(choice["delta"].get("content") for choice in event["choices"])
                return rid, chunks
    return await asyncio.gather(*(one(index) for index in range(STREAMS)))


def counter_total(text: str, name: str, **labels: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def test_a_sharded_server_serves_concurrent_streams_and_adds_up_as_one(sim, tmp_path):
    log = tmp_path / "emissions.jsonl"
    server = sim([*SPEC_ARGS, *TWO_RANKS, "--enable-metrics"],
                 env={**SHARDED, "DSPARK_SIM_EMISSION_LOG": str(log)})
    shards = shard_processes(server)
    assert len(shards) == 2
    replies = asyncio.run(stream_all(server.base_url))
    assert all(chunks > 0 for _, chunks in replies)

    metrics = requests.get(server.url("/metrics"), timeout=10).text
    assert counter_total(metrics, "sglang:num_requests_total", is_streaming="true") == STREAMS
    assert counter_total(metrics, "sglang:num_requests_total", is_streaming="false") == 2  # a warm-up per rank
    assert counter_total(metrics, "sglang:generation_tokens_total", is_streaming="true") == STREAMS * TOKENS
    assert len({s.labels["pid"] for f in text_string_to_metric_families(metrics) for s in f.samples
                if "pid" in s.labels}) == 1  # one server

    deadline = time.monotonic() + 10
    while len(lines := log.read_text().splitlines() if log.exists() else []) < STREAMS and time.monotonic() < deadline:
        time.sleep(0.05)
    records = [json.loads(line) for line in lines]
    assert sorted(r["rid"] for r in records) == sorted(rid for rid, _ in replies)
    assert sum(r["completion_tokens"] for r in records) == STREAMS * TOKENS
    assert {r["scheduler_dp_rank"] for r in records} == {0, 1}  # both shards served

    states = requests.get(server.url("/server_info"), timeout=10).json()["internal_states"]
    verify_calls = counter_total(metrics, "sglang:spec_verify_calls_total")
    assert len(states) == 2 and all("avg_spec_accept_length" in state for state in states)
    assert sum(r["emissions"] - 1 for r in records) <= verify_calls  # the warm-ups verified too

    server.stop()  # SIGTERM to the server's process only: it stops its shards
    assert server.process.returncode == 0
    assert gone(shards)


def test_killing_the_server_leaves_no_shard(sim):
    run_id = f"shards-{os.getpid()}"
    server = sim([*TWO_RANKS], env={**SHARDED, RUN_ENV: run_id})
    shards = shard_processes(server)
    assert len(shards) == 2
    # what a launcher's cleanup looks for: its run's mark in the server's process group, shards included
    found = {proc.pid for proc in group_members(os.getpgid(server.process.pid), run_id)}
    assert {server.process.pid, *(proc.pid for proc in shards)} <= found
    server.process.send_signal(signal.SIGKILL)  # no chance to stop them: they die with it
    server.process.wait(timeout=10)
    assert gone(shards)


def test_a_crashing_shard_takes_the_server_down_with_sglangs_error_line(sim):
    server = sim([*TWO_RANKS], env={**SHARDED, "DSPARK_SIM_FAULTS": "crash_first_prefill"})
    shards = shard_processes(server)
    with pytest.raises(requests.RequestException):
        requests.post(server.url("/generate"), json={"text": "hi", "sampling_params": {"max_new_tokens": 4}},
                      timeout=10)
    assert server.wait_exit() == 1
    assert "[sglang_sim fault crash_first_prefill]" in server.last_line()
    assert gone(shards)


@pytest.mark.parametrize("shards, args, says", [
    ("3", TWO_RANKS, "each shard schedules whole DP ranks and this launch has 2"),
    ("0", [], "expected a count >= 1 or auto"),
    ("two", [], "expected an integer"),
])
def test_an_unusable_shard_count_is_refused_before_launch(shards, args, says):
    done = run_sim_to_exit(args, env={"DSPARK_SIM_SHARDS": shards})
    assert done.returncode == 2
    assert "DSPARK_SIM_SHARDS" in done.stderr and says in done.stderr
