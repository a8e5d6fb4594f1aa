"""The Docker launcher: every rank of a cell as a container, node rank r on host r of the inventory.

This module is the launcher (placement, preflight, launch); a launch's containers are ``launchers/docker/group.py``,
the engine calls ``client.py``, removal ``cleanup.py``, what a container looks like ``spec.py``.

Used like every launcher (``dspark_ci.launchers.contract``)::

    launcher = DockerLauncher(DockerOptions(hosts="hosts.yaml"), LaunchContext(run_id, run_dir, caller_env=os.environ))
    with launcher.launch(launcher_plan, logs_dir) as deployment:
        ...  # deployment.base_url; deployment.check() raises LaunchFailed if a rank died

Containers run as SGLang documents (host network, ``ipc=host``, shm size, GPUs or Ascend devices, the HF
cache) and carry labels (run, cell, rank, launch) so that teardown — and ``dspark-ci cleanup`` after a hard
kill — finds every one of them. Rank 0's health is awaited against our own deadline while every rank's
container state is polled, so a dead rank fails the launch at once with its exit code and log.
Teardown, whatever happened (error, Ctrl-C, SIGTERM): stop every container with a short timeout, keep
its full log, force-remove it. Nothing is left running or stopped.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlparse

from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.processes import free_port, port_is_free, signals_deferred, sigterm_as_interrupt
from dspark_ci.launchers.contract import SERVERS, Capacity, LaunchContext, Need, best_fit, gpus_wanted
from dspark_ci.launchers.docker.cleanup import remove_started
from dspark_ci.launchers.docker.client import ensure_image
from dspark_ci.launchers.docker.group import DockerDeployment, Group, RankContainer
from dspark_ci.launchers.docker.hosts import DockerHost, Inventory, clients, load_inventory
from dspark_ci.launchers.docker.options import DockerOptions
from dspark_ci.launchers.docker.spec import (
    LABEL_CELL,
    LABEL_LAUNCH,
    LABEL_RUN,
    container_env,
    container_spec,
    device_environment,
    files_to_copy,
    image_for,
)
from dspark_ci.launchers.docker.tuning import DockerTuning
from dspark_ci.launchers.logs import rank_log_path
from dspark_ci.launchers.materialize import secret_values
from dspark_ci.launchers.plan_types import LaunchPlan, Placement, RankCommand
from dspark_ci.launchers.readiness import Deadline, OurServer, wait_until_ready

__all__ = ["DockerLauncher", "HostLeases", "build", "remove_started"]  # remove_started: the catalog's contract

REMOTE_PORT_TRIES = 20


def build(context: LaunchContext, options: DockerOptions) -> DockerLauncher:
    """The catalog's constructor (dspark_ci.launchers.catalog): --hosts, --pull and --image, checked, in ``options``."""
    return DockerLauncher(options, context)


class HostLeases:
    """Which inventory hosts, and which of their GPUs, the cells in flight hold; given back when a cell's containers
    are torn down. Plans are known by their leader address and port (unique within a run).

    When the inventory gives every host's GPUs (``gpus:`` ids or a count), a node takes ``gpus_per_node`` of them,
    on the fullest host that still has room (``dspark_ci.launchers.contract.best_fit``, as the run's capacity packs),
    and its container is given exactly those device ids: a host with 8 GPUs holds two 4-GPU cells side by side.
    Otherwise a host is one slot: a new cell's nodes go to the least busy hosts (with the run's capacity, at most one
    cell per host). When nothing has room (a parity reference beside its cell, or cells that ended out of order left
    the room scattered), the least used devices are shared, as every cell shared a host before hosts were counted."""

    def __init__(self, inventory: Inventory):
        self._inventory = inventory
        self._lock = threading.Lock()
        devices = [_device_ids(host) for host in inventory.hosts]
        self._counted = not inventory.local_nodes_on_loopback and all(ids is not None for ids in devices)
        # cells holding each device of each host; an uncounted host is one slot (device 0)
        self._users = [dict.fromkeys(ids if self._counted and ids is not None else (0,), 0) for ids in devices]
        self._held: dict[tuple[str, int], tuple[DockerHost, ...]] = {}

    @property
    def host_gpus(self) -> tuple[int, ...]:
        """Each host's GPU count when the inventory gives them all, else ()."""
        return tuple(len(users) for users in self._users) if self._counted else ()

    def take(self, nnodes: int, gpus_per_node: int | None = None) -> tuple[DockerHost, ...]:
        """Hosts for a cell's nodes (narrowed to the GPUs leased on each), counted busy at once (two cells placed at
        the same moment never both get the same devices); ``placed`` then names them by the plan, or ``give_back``
        returns them if placing failed."""
        if self._inventory.local_nodes_on_loopback or nnodes > len(self._inventory.hosts):
            return self._inventory.hosts_for(nnodes)  # the one local engine, or a message naming the shortfall
        need = Need(nnodes, gpus_per_node if self._counted else 1)
        with self._lock:
            free = [sum(users == 0 for users in host.values()) for host in self._users]
            totals = [len(host) for host in self._users]
            chosen = best_fit(free, totals, need)
            if chosen is None:
                chosen = sorted(range(len(free)), key=lambda i: (sum(self._users[i].values()), i))[:nnodes]
                if self._counted:
                    print(f"dspark-ci: warning: no {nnodes} Docker host(s) with {need.gpus_per_node} free GPU(s): "
                          "sharing the least used GPUs of "
                          f"{', '.join(self._inventory.hosts[i].address for i in chosen)}",
                          file=sys.stderr)
            return tuple(self._lease(i, gpus_wanted(need, totals[i])) for i in chosen)

    def _lease(self, index: int, count: int) -> DockerHost:
        users = self._users[index]
        ids = sorted(users, key=lambda device: (users[device], device))[:count]
        for device in ids:
            users[device] += 1
        host = self._inventory.hosts[index]
        return replace(host, gpus=tuple(ids)) if self._counted else host

    def placed(self, placement: Placement, hosts: tuple[DockerHost, ...]) -> None:
        with self._lock:
            self._held[(placement.leader_addr, placement.port)] = hosts

    def give_back(self, hosts: tuple[DockerHost, ...]) -> None:
        if self._inventory.local_nodes_on_loopback:
            return  # nothing was counted
        with self._lock:
            for host in hosts:
                index = self._index(host)
                users = self._users[index] if index is not None else {}
                for device in host.gpus if self._counted and isinstance(host.gpus, tuple) else (0,):
                    if device in users:
                        users[device] = max(0, users[device] - 1)

    def _index(self, host: DockerHost) -> int | None:
        return next((i for i, listed in enumerate(self._inventory.hosts)
                     if (listed.url, listed.address) == (host.url, host.address)), None)

    def hosts_of(self, plan: LaunchPlan) -> tuple[DockerHost, ...] | None:
        with self._lock:
            return self._held.get(_plan_key(plan))

    def release(self, plan: LaunchPlan) -> None:
        with self._lock:
            hosts = self._held.pop(_plan_key(plan), ())
        self.give_back(hosts)


def _device_ids(host: DockerHost) -> tuple[int, ...] | None:
    """A host's GPU ids from the inventory (``gpus: [0, 1]`` or ``gpus: 8``); None when it does not say."""
    if isinstance(host.gpus, tuple):
        return host.gpus
    return tuple(range(host.gpus)) if isinstance(host.gpus, int) else None


def _plan_key(plan: LaunchPlan) -> tuple[str, int]:
    url = urlparse(plan.base_url)
    return url.hostname or "", url.port or 0


# --- the launcher ------------------------------------------------------------------------------------

class DockerLauncher:
    name = "docker"

    def __init__(self, options: DockerOptions, context: LaunchContext, tuning: DockerTuning = DockerTuning()):
        """The user's options as declared (one record), the run's context, and what no user sets. The engines are
        the inventory ``--hosts`` names, else the caller's $DSPARK_DOCKER_HOSTS, else the local engine."""
        if context.server not in SERVERS:
            raise BadInput("--server", f"unknown server {context.server!r}", f"choose from {', '.join(SERVERS)}")
        self.options, self.context, self.tuning = options, context, tuning
        self.ledger = Ledger(context.run_id, context.run_dir)  # every container is recorded here before it exists
        self.inventory = load_inventory(options.hosts, context.caller_env)
        # Each run starts its remote ports at its own offset (0..9990): concurrent runs rarely even try the same.
        start = int(hashlib.sha256(context.run_id.encode()).hexdigest(), 16) % 1000 * 10
        self._remote_offsets = (start + i for i in itertools.count())
        self._leases = HostLeases(self.inventory)

    def capacity(self) -> Capacity:
        """With every host's GPUs in the inventory, as many cells side by side as their GPUs fit (a node takes its
        ``gpus_per_node`` on one host: two 4-GPU cells share an 8-GPU host); without them, as many as the inventory
        lists hosts (a host serves one node of one cell at a time: its GPUs go to that container); with no
        inventory, the one local engine runs one cell at a time."""
        inventory = self.inventory
        if inventory.local_nodes_on_loopback:
            return Capacity(1, None, "no Docker hosts inventory (--hosts): the local engine runs one cell at a time")
        gpus = self._leases.host_gpus
        if gpus:
            return Capacity(max(1, sum(gpus)), None, f"{sum(gpus)} GPUs on {len(gpus)} Docker host(s) in "
                            f"{inventory.source}, each node taking its gpus_per_node on one host", host_gpus=gpus)
        return Capacity(len(inventory.hosts), len(inventory.hosts),
                        f"{len(inventory.hosts)} Docker host(s) in {inventory.source}")

    def placement(self, nnodes: int, gpus_per_node: int | None = None) -> Placement:
        """Node rank r on the r-th host the leases give (cells side by side get hosts, or GPUs, of their own)."""
        hosts = self._leases.take(nnodes, gpus_per_node)
        try:
            if all(host.is_local for host in hosts):  # containers share this machine's ports
                port, dist_port = free_port(), free_port()
            else:
                port, dist_port = self._remote_ports(hosts)
        except BaseException:
            self._leases.give_back(hosts)
            raise
        placement = Placement(bind_hosts=tuple(h.address for h in hosts), leader_addr=hosts[0].address, port=port,
                              dist_port=dist_port)
        self._leases.placed(placement, hosts)
        return placement

    def _remote_ports(self, hosts) -> tuple[int, int]:
        """Ports on remote nodes: a block of its own for each run (from the run id, so two runs on one engine do
        not start on the same numbers), each pair checked free on every node before use."""
        for _ in range(REMOTE_PORT_TRIES):
            offset = next(self._remote_offsets)
            port, dist_port = self.tuning.port + offset, self.tuning.dist_port + offset
            if all(port_is_free(h.address, p) for h in hosts for p in (port, dist_port)):
                return port, dist_port
        raise InfraError(f"no free port pair found on {', '.join(h.address for h in hosts)} after "
                         f"{REMOTE_PORT_TRIES} tries from {self.tuning.port}: check what listens there")

    def preflight(self, plans: Sequence[LaunchPlan]) -> None:
        """Before any launch: every engine the cells need answers and holds their image (pulled now, per
        policy, so a pull never counts as boot time and a missing image fails the run in seconds)."""
        images_by_engine: dict[str, set[str]] = {}
        for plan in plans:
            image = self.image_for(plan)
            for host in self.inventory.hosts_for(len(plan.ranks)):
                images_by_engine.setdefault(host.url, set()).add(image)
        with clients(images_by_engine) as engines:
            for url, client in engines.items():
                for image in sorted(images_by_engine[url]):
                    ensure_image(client, url, image, self.options.pull)

    def image_for(self, plan: LaunchPlan) -> str:
        return image_for(self.options, self.context, self.tuning, plan)

    @contextlib.contextmanager
    def launch(self, plan: LaunchPlan, logs_dir: Path) -> Iterator[DockerDeployment]:
        logs_dir.mkdir(parents=True, exist_ok=True)
        hosts = self._leases.hosts_of(plan) or self.inventory.hosts_for(len(plan.ranks))
        image = self.image_for(plan)
        labels = {LABEL_RUN: self.context.run_id, LABEL_CELL: plan.cell_id, LABEL_LAUNCH: uuid.uuid4().hex[:8]}
        with clients(host.url for host in hosts) as engines, sigterm_as_interrupt():
            group = Group(labels, engines, self.tuning.stop_timeout_s, self.ledger)
            try:
                for url, client in engines.items():
                    ensure_image(client, url, image, self.options.pull)
                started = time.monotonic()
                for command, host in zip(plan.ranks, hosts, strict=False):
                    group.start(self._rank_container(command, host, image, labels, plan.accelerator, logs_dir))
                deployment = DockerDeployment(plan.cell_id, plan.base_url, group)
                wait_until_ready(OurServer(plan), Deadline(self.context.boot_timeout_s, self.tuning.poll_s),
                                 deployment.check, cell_id=plan.cell_id, last_lines=group.rank0_tail)
                deployment.boot_seconds = time.monotonic() - started  # container starts included
                yield deployment
            finally:
                with signals_deferred():
                    group.teardown()
                    self._leases.release(plan)

    def _rank_container(self, command: RankCommand, host: DockerHost, image: str, labels: Mapping[str, str],
                        accelerator: str, logs_dir: Path) -> RankContainer:
        context, prefixes = self.context, self.tuning.forward_env_prefixes
        env = {**device_environment(host, accelerator, context.server),
               **container_env(command, context.caller_env, prefixes)}
        return RankContainer(command=command, host=host,
                              spec=container_spec(command, host, image, labels, context, self.tuning, accelerator),
                              env=env, secrets=secret_values(command.env, context.caller_env),
                              files=files_to_copy(env, prefixes),
                              log_path=rank_log_path(logs_dir, command.node_rank))
