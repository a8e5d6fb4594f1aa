"""The Docker launcher: every rank of a cell as a container, node rank r on host r of the inventory.

This module is the engine lifecycle (create, watch, log, tear down); what a container looks like is
``launchers/docker/spec.py``.

Used like the local launcher::

    launcher = DockerLauncher(DockerSettings(server="sim", inventory=load_inventory(path, os.environ)))
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
import io
import hashlib
import itertools
import re
import sys
import tarfile
import threading
import time
import uuid
from datetime import datetime, timezone
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence
from urllib.parse import urlparse

import docker
import docker.errors
import requests
from docker.utils import parse_repository_tag

from ground.errors import InfraError
from launchers.contract import (LOG_LINES_KEPT, LOG_LINES_SEARCHED, Capacity, LaunchContext, Need, RankExit,
                                best_fit, culprit, group_failed, gpus_wanted)
from launchers.docker.spec import (LABEL_CELL, LABEL_LAUNCH, LABEL_RUN, SIM_IMAGE, DockerSettings, container_env,
                                   container_spec, device_environment, files_to_copy, image_for)
from launchers.docker.options import DockerOptions
from launchers.docker.hosts import DockerHost, Inventory, clients, connect, load_inventory
from launchers.ledger import Ledger
from launchers.processes import free_port, port_is_free, signals_deferred, sigterm_as_interrupt
from launchers.logs import rank_log_path
from launchers.plan_types import LaunchPlan, Placement, RankCommand
from launchers.materialize import redact, secret_values
from launchers.readiness import Deadline, OurServer, wait_until_ready

_EXITED = ("exited", "dead")
SETTLE_S = 0.5  # after seeing one rank exit, let every engine catch up before naming the culprit
REMOTE_PORT_TRIES = 20
LOG_RECONNECT_S = 1.0  # pause before following a container's log again after its stream ended

def build(context: LaunchContext, options: DockerOptions) -> "DockerLauncher":
    """The catalog's constructor (launchers.catalog): --hosts, --pull and --image, checked, in ``options``."""
    return DockerLauncher(DockerSettings(
        server=context.server, image=options.image, pull=options.pull, boot_timeout_s=context.boot_timeout_s,
        inventory=load_inventory(options.hosts, context.caller_env), caller_env=dict(context.caller_env),
        run_id=context.run_id, ledger=Ledger(context.run_id, context.run_dir)))


class HostLeases:
    """Which inventory hosts, and which of their GPUs, the cells in flight hold; given back when a cell's containers
    are torn down. Plans are known by their leader address and port (unique within a run).

    When the inventory gives every host's GPUs (``gpus:`` ids or a count), a node takes ``gpus_per_node`` of them,
    on the fullest host that still has room (``launchers.contract.best_fit``, as the run's capacity packs), and its
    container is given exactly those device ids: a host with 8 GPUs holds two 4-GPU cells side by side. Otherwise
    a host is one slot: a new cell's nodes go to the least busy hosts (with the run's capacity, at most one cell
    per host). When nothing has room (a parity reference beside its cell, or cells that ended out of order left
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
                          f"sharing the least used GPUs of {', '.join(self._inventory.hosts[i].address for i in chosen)}",
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

    def __init__(self, settings: DockerSettings | None = None):
        self.settings = settings or DockerSettings()
        # Each run starts its remote ports at its own offset (0..9990): concurrent runs rarely even try the same.
        start = int(hashlib.sha256(self.settings.run_id.encode()).hexdigest(), 16) % 1000 * 10
        self._remote_offsets = (start + i for i in itertools.count())
        self._leases = HostLeases(self.settings.inventory)

    def capacity(self) -> Capacity:
        """With every host's GPUs in the inventory, as many cells side by side as their GPUs fit (a node takes its
        ``gpus_per_node`` on one host: two 4-GPU cells share an 8-GPU host); without them, as many as the inventory
        lists hosts (a host serves one node of one cell at a time: its GPUs go to that container); with no
        inventory, the one local engine runs one cell at a time."""
        inventory = self.settings.inventory
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
            port, dist_port = self.settings.port + offset, self.settings.dist_port + offset
            if all(port_is_free(h.address, p) for h in hosts for p in (port, dist_port)):
                return port, dist_port
        raise InfraError(f"no free port pair found on {', '.join(h.address for h in hosts)} after "
                         f"{REMOTE_PORT_TRIES} tries from {self.settings.port}: check what listens there")

    def preflight(self, plans: Sequence[LaunchPlan]) -> None:
        """Before any launch: every engine the cells need answers and holds their image (pulled now, per
        policy, so a pull never counts as boot time and a missing image fails the run in seconds)."""
        images_by_engine: dict[str, set[str]] = {}
        for plan in plans:
            image = self.image_for(plan)
            for host in self.settings.inventory.hosts_for(len(plan.ranks)):
                images_by_engine.setdefault(host.url, set()).add(image)
        with clients(images_by_engine) as engines:
            for url, client in engines.items():
                for image in sorted(images_by_engine[url]):
                    ensure_image(client, url, image, self.settings.pull)

    def image_for(self, plan: LaunchPlan) -> str:
        return image_for(self.settings, plan)

    @contextlib.contextmanager
    def launch(self, plan: LaunchPlan, logs_dir: Path) -> Iterator["DockerDeployment"]:
        logs_dir.mkdir(parents=True, exist_ok=True)
        hosts = self._leases.hosts_of(plan) or self.settings.inventory.hosts_for(len(plan.ranks))
        image = self.image_for(plan)
        labels = {LABEL_RUN: self.settings.run_id, LABEL_CELL: plan.cell_id, LABEL_LAUNCH: uuid.uuid4().hex[:8]}
        with clients(host.url for host in hosts) as engines, sigterm_as_interrupt():
            group = _Group(labels, engines, self.settings.stop_timeout_s, self.settings.ledger)
            try:
                for url, client in engines.items():
                    ensure_image(client, url, image, self.settings.pull)
                started = time.monotonic()
                for command, host in zip(plan.ranks, hosts):
                    group.start(self._rank_container(command, host, image, labels, plan.accelerator, logs_dir))
                deployment = DockerDeployment(plan.cell_id, plan.base_url, group)
                wait_until_ready(OurServer(plan), Deadline(self.settings.boot_timeout_s, self.settings.poll_s),
                                 deployment.check, cell_id=plan.cell_id, last_lines=group.rank0_tail)
                deployment.boot_seconds = time.monotonic() - started  # container starts included
                yield deployment
            finally:
                with signals_deferred():
                    group.teardown()
                    self._leases.release(plan)

    def _rank_container(self, command: RankCommand, host: DockerHost, image: str, labels: Mapping[str, str],
                        accelerator: str, logs_dir: Path) -> "_RankContainer":
        s = self.settings
        env = {**device_environment(host, accelerator, s.server),
               **container_env(command, s.caller_env, s.forward_env_prefixes)}
        return _RankContainer(command=command, host=host,
                              spec=container_spec(command, host, image, labels, s, accelerator),
                              env=env, secrets=secret_values(command.env, s.caller_env),
                              files=files_to_copy(env, s.forward_env_prefixes),
                              log_path=rank_log_path(logs_dir, command.node_rank))


class DockerDeployment:
    def __init__(self, cell_id: str, base_url: str, group: "_Group"):
        self.cell_id, self.base_url, self._group = cell_id, base_url, group
        self.boot_seconds = 0.0

    def check(self) -> None:
        """Raise LaunchFailed naming the rank whose container exited first."""
        self._group.check(self.cell_id)


# --- images --------------------------------------------------------------------------------------

def ensure_image(client: docker.DockerClient, url: str, image: str, policy: str) -> None:
    """The image on this engine, pulled by policy; InfraError with what to do when it cannot be had."""
    try:
        client.images.get(image)
        present = True
    except docker.errors.ImageNotFound:
        present = False
    if policy == "never" and not present:
        raise InfraError(f"image {image} is not on Docker engine {url} and the pull policy is `never`; "
                         f"{_image_hint(image, url)}")
    if policy == "always" or not present:
        repository, tag = parse_repository_tag(image)
        try:
            client.images.pull(repository, tag=tag or "latest")
        except (docker.errors.APIError, requests.RequestException) as err:
            raise InfraError(f"cannot pull {image} onto Docker engine {url} ({str(err).splitlines()[0][:160]}); "
                             f"{_image_hint(image, url)}") from None


def _image_hint(image: str, url: str) -> str:
    if image == SIM_IMAGE:
        return f"build it without a registry: docker/build-sim-image.sh --docker-host {url}"
    return (f"no registry reachable? load it from a machine that has it: "
            f"`docker save {image} | docker -H {url} load`, or run with --pull never after loading")


# --- one launched group of containers --------------------------------------------------------------

@dataclass(frozen=True)
class _RankContainer:
    """Everything needed to start one node rank's container."""

    command: RankCommand
    host: DockerHost
    spec: dict  # containers.create arguments, without the environment
    env: dict[str, str]  # resolved: holds secret values
    secrets: list[str]  # to mask wherever text could be printed
    files: list[Path]  # copied into the container before it starts
    log_path: Path


@dataclass
class _Rank:
    command: RankCommand
    host: DockerHost
    container: Any  # docker.models.containers.Container (the SDK is untyped)
    log: "_LogPump"


class _Group:
    """The containers of one launch: started one by one, watched together, removed together."""

    def __init__(self, labels: Mapping[str, str], engines: Mapping[str, docker.DockerClient], stop_timeout_s: int,
                 ledger: Ledger | None = None):
        self.labels, self.engines, self.stop_timeout_s, self.ledger = dict(labels), engines, stop_timeout_s, ledger
        self.ranks: list[_Rank] = []
        self.attempted: list[tuple[str, str]] = []  # (engine, container name) of every create sent, even unanswered

    def start(self, rank: _RankContainer) -> None:
        command, host, spec = rank.command, rank.host, rank.spec
        if self.ledger:  # before it exists: a hard kill after create still leaves a record naming it
            self.ledger.record("docker", self.labels[LABEL_CELL], command.node_rank, engine=host.url,
                               container=spec["name"])
        self.attempted.append((host.url, spec["name"]))
        try:
            # A Ctrl-C or SIGTERM landing while the engine creates the container is held until the container is
            # ours to remove (the engine finishes the create whatever we do; the caller must know the container).
            with signals_deferred():
                container = self.engines[host.url].containers.create(environment=rank.env, **spec)
                header = (f"# node rank {command.node_rank} on {host.url} ({host.address}), image {spec['image']}, "
                          f"container {spec['name']}\n# {' '.join(spec['command'])}\n")
                log = _LogPump(container, rank.log_path, redact(header, rank.secrets), rank.secrets)
                self.ranks.append(_Rank(command, host, container, log))  # from here on, teardown removes it
            _copy_into(container, rank.files)
            container.start()
        except docker.errors.APIError as err:
            raise InfraError(f"Docker engine {host.url} could not start node rank {command.node_rank} "
                             f"({spec['name']}, image {spec['image']}): "
                             f"{redact(err.explanation or str(err), rank.secrets)}") from None
        log.start()

    def check(self, cell_id: str) -> None:
        if not self._exited():
            return
        time.sleep(SETTLE_S)  # another engine may not have registered its rank's exit yet
        exited = self._exited()
        exits = [RankExit(e.rank.command.node_rank, e.code, e.finished_at, e.rank.log.last_lines(LOG_LINES_SEARCHED))
                 for e in exited]
        blamed = next(e for e in exited if e.rank.command.node_rank == culprit(exits).node_rank)
        raise group_failed(cell_id, exits, [f"container on {blamed.rank.host.url}", f"full log: {blamed.rank.log.path}"])

    def _exited(self) -> list["_Exit"]:
        states = [(rank, self._state(rank)) for rank in self.ranks]
        return [_Exit(rank, state.get("ExitCode"), _seconds(state.get("FinishedAt", "")))
                for rank, state in states if state.get("Status") in _EXITED]

    def _state(self, rank: _Rank) -> dict:
        try:
            rank.container.reload()
            return rank.container.attrs.get("State", {})
        except docker.errors.NotFound:
            return {"Status": "dead", "ExitCode": None, "Error": "container removed behind our back"}
        except (docker.errors.APIError, requests.RequestException) as err:
            raise InfraError(f"lost Docker engine {rank.host.url} while watching node rank "
                             f"{rank.command.node_rank}: {str(err).splitlines()[0][:160]}") from None

    def rank0_tail(self) -> list[str]:
        return self.ranks[0].log.last_lines(LOG_LINES_KEPT) if self.ranks else []

    def teardown(self) -> None:
        """Stop, keep the log of, and remove every container of this launch, on every engine, in parallel."""
        known = {rank.container.id: rank for rank in self.ranks}
        stragglers = {c.id: c for client in self.engines.values() for c in _labelled(client, self.labels)
                      if c.id not in known}  # e.g. created just as Ctrl-C arrived
        named = {rank.container.name for rank in self.ranks}
        stragglers.update({c.id: c for url, name in self.attempted if name not in named
                           for c in _named(self.engines[url], name) if c.id not in known})
        jobs = [lambda r=rank: _dispose(r.container, self.stop_timeout_s, r.log) for rank in self.ranks]
        jobs += [lambda c=container: _dispose(c, 0, None) for container in stragglers.values()]
        if jobs:
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                for future in [pool.submit(job) for job in jobs]:
                    future.result()


@dataclass(frozen=True)
class _Exit:
    rank: _Rank
    code: int | None
    finished_at: float  # engine's clock, seconds


def _seconds(rfc3339: str) -> float:
    """Docker's FinishedAt (nanoseconds, trailing zeros trimmed) as a number that sorts right."""
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?", rfc3339 or "")
    if not match:
        return float("inf")
    whole = datetime.fromisoformat(match.group(1)).replace(tzinfo=timezone.utc).timestamp()
    return whole + float(match.group(2) or 0)


def _dispose(container, stop_timeout_s: int, log: "_LogPump | None") -> None:
    """Stop (short grace), save the complete log, force-remove. Never raises: teardown must go on."""
    try:
        with contextlib.suppress(docker.errors.APIError, requests.RequestException):
            container.stop(timeout=stop_timeout_s)
        try:
            if log:
                log.finish()
        finally:  # whatever keeping the log met, the container goes
            container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass
    except (docker.errors.APIError, requests.RequestException) as err:
        print(f"dspark-ci: could not remove container {container.name}: {err} "
              "(`dspark-ci cleanup` removes it later)", file=sys.stderr)


def remove_leftover(container) -> None:
    """Remove a container at once (its run is gone: there is nobody to stop it gracefully for)."""
    with contextlib.suppress(docker.errors.NotFound):
        container.remove(force=True, v=True)


def remove_started(entry: dict) -> str | None:
    """Remove the container a dead run recorded in its ledger, on the engine it recorded (catalog contract)."""
    client = connect(entry["engine"])
    try:
        container = client.containers.get(entry["container"])
        if container.labels.get(LABEL_RUN) != entry.get("run_id"):
            return None  # the name was reused by another run: not ours to touch
        remove_leftover(container)
        return f"container {entry['container']} on {entry['engine']} (cell {entry.get('cell')}, rank {entry.get('rank')})"
    except docker.errors.NotFound:
        return None
    finally:
        client.close()


def _labelled(client: docker.DockerClient, labels: Mapping[str, str]) -> list:
    try:  # a container removed between the engine's listing and its inspection is skipped, not an error
        return client.containers.list(all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]},
                                      ignore_removed=True)
    except (docker.errors.APIError, requests.RequestException):
        return []


def _named(client: docker.DockerClient, name: str) -> list:
    """The container of this exact name, if the engine has it (a create sent but never answered)."""
    try:
        return [client.containers.get(name)]
    except (docker.errors.APIError, requests.RequestException):
        return []


def _copy_into(container, paths: list[Path]) -> None:
    if not paths:
        return
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in paths:
            archive.add(str(path), arcname=str(path).lstrip("/"))
    container.put_archive("/", buffer.getvalue())


# --- logs ------------------------------------------------------------------------------------------

class _LogPump:
    """Copies one container's output into its rank log as it comes, secrets redacted.

    A follow stream may never end after the container exits, so the pump is a daemon thread whose stream
    teardown closes; ``finish`` then rewrites the file from the engine's complete, non-streamed log. A stream
    may also end while the container still runs (an idle HTTP connection dropped by the client or a proxy):
    the pump then reconnects from the last line's timestamp, so the rank log stays live.
    """

    def __init__(self, container, path: Path, header: str, secrets: list[str]):
        self.container, self.path, self.header, self.secrets = container, path, header, secrets
        self._stream: Any = None
        self._lock = threading.Lock()
        self._finished = False
        path.write_text(header)
        self._thread = threading.Thread(target=self._pump, name=f"log-{path.parent.name}-{path.stem}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _pump(self) -> None:
        since: float | None = None
        while not self._finished:
            pending = b""
            with contextlib.suppress(Exception):  # the stream ends by closing, with the engine, or idle
                self._stream = self.container.logs(stream=True, follow=True, stdout=True, stderr=True,
                                                   timestamps=True, since=since)
                for chunk in self._stream:
                    pending += chunk
                    complete, _, pending = pending.rpartition(b"\n")
                    if complete:
                        since = self._append(complete + b"\n") or since
            if pending:
                since = self._append(pending) or since
            if self._finished or not self._running():
                return
            time.sleep(LOG_RECONNECT_S)

    def _running(self) -> bool:
        try:
            self.container.reload()
            return self.container.status == "running"
        except (docker.errors.APIError, requests.RequestException):
            return False

    def _append(self, data: bytes) -> float | None:
        """Write timestamped lines without their stamps; return the last line's time (to reconnect after it)."""
        lines, last = [], None
        for line in data.decode("utf-8", "replace").splitlines(keepends=True):
            stamp, _, text = line.partition(" ")
            when = _seconds(stamp)
            if when != float("inf"):
                last, line = when, text
            lines.append(line)
        with self._lock:
            if not self._finished:
                with open(self.path, "a") as handle:
                    handle.write(redact("".join(lines), self.secrets))
        return None if last is None else last + 1e-6

    def last_lines(self, count: int) -> list[str]:
        """The container's last lines, straight from the engine (the pump may lag behind)."""
        try:
            text = self.container.logs(stdout=True, stderr=True, tail=count).decode("utf-8", "replace")
        except (docker.errors.APIError, requests.RequestException):
            text = self.path.read_text(errors="replace")
        return redact(text, self.secrets).splitlines()[-count:]

    def finish(self) -> None:
        with contextlib.suppress(Exception):
            if self._stream is not None:
                self._stream.close()
        if self._thread.ident is not None:  # not started when the interrupt came before the container started
            self._thread.join(timeout=2)
        with contextlib.suppress(docker.errors.APIError, requests.RequestException):
            full = self.container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            with self._lock:
                self._finished = True
                self.path.write_text(self.header + redact(full, self.secrets))
