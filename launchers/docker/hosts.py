"""The Docker engines a cell's ranks run on: the hosts inventory, and one client per engine.

An inventory is a YAML file (``--hosts FILE``)::

    hosts:
      - url: ssh://ci@gpu-node-1      # unix://, tcp:// or ssh:// (ssh goes through the ssh client)
        address: 10.0.0.11            # how the other nodes and this machine reach it (--dist-init-addr, health URL)
        gpus: [0, 1, 2, 3]            # explicit device ids, or a count; omitted: every device it has
        labels: {rack: a}             # free-form, shown in messages
      - url: ssh://ci@gpu-node-2
        address: 10.0.0.12

or the environment variable ``DSPARK_DOCKER_HOSTS``: whitespace-separated ``URL`` or ``URL=ADDRESS`` entries,
e.g. ``unix:///var/run/docker.sock=127.0.0.1 unix:///run/dspark-docker2.sock=127.0.0.2``.
Without either: the local engine (``DOCKER_HOST`` or the default socket), which then stands in for every
node of a multi-node cell (node rank r at 127.0.0.(r+1)).

A multi-node cell puts node rank r on host r. Several engines on one machine share its network (containers
use host networking), so a local engine's address defaults to its own loopback address, 127.0.0.(i+1):
each "node" then binds its own address and the same port, as real nodes do. The same engine may be
listed twice (with two addresses) to run a 2-node cell on one engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from urllib.parse import urlparse

import docker.errors
import requests
from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.ground.yaml_lines import YamlList, YamlMap, config_file_words, load_yaml
from dspark_ci.launchers.plan_types import Placement

import docker

HOSTS_ENV = "DSPARK_DOCKER_HOSTS"
DEFAULT_ENGINE = "unix:///var/run/docker.sock"
SCHEMES = ("unix", "tcp", "ssh", "http", "https")
_HOST_KEYS = ("url", "address", "gpus", "labels")


@dataclass(frozen=True)
class DockerHost:
    url: str  # the engine's base URL
    address: str  # where its containers are reached (host networking)
    gpus: tuple[int, ...] | int | None = None  # explicit device ids, a count, or None for all
    labels: Mapping[str, str] = field(default_factory=dict)
    where: str = ""  # "hosts.yaml:4" / "DSPARK_DOCKER_HOSTS": for messages

    def __post_init__(self):
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    @property
    def is_local(self) -> bool:
        """An engine on this machine: its containers share our network and our files."""
        return urlparse(self.url).scheme in ("unix", "")


@dataclass(frozen=True)
class Inventory:
    hosts: tuple[DockerHost, ...]
    source: str  # the file, the environment variable, or "the local engine"
    # No inventory given: the local engine stands in for as many nodes as a cell has, node rank r at
    # 127.0.0.(r+1), as the local launcher does. A written inventory means what it lists.
    local_nodes_on_loopback: bool = False

    def hosts_for(self, nnodes: int) -> tuple[DockerHost, ...]:
        """Node rank r -> host r."""
        if nnodes > len(self.hosts) and self.local_nodes_on_loopback and self.hosts[0].is_local:
            return tuple(replace(self.hosts[0], address=f"127.0.0.{rank + 1}") for rank in range(nnodes))
        if nnodes > len(self.hosts):
            raise BadInput(self.source, f"a {nnodes}-node cell needs {nnodes} Docker hosts, the inventory lists "
                                        f"{len(self.hosts)}",
                           f"list {nnodes} engines in --hosts FILE or {HOSTS_ENV} (on one machine, the same engine "
                           "may appear twice with addresses 127.0.0.1 and 127.0.0.2), or deselect the cell")
        return self.hosts[:nnodes]

    def placement(self, nnodes: int, port: int, dist_port: int) -> Placement:
        """Each node rank binds its host's address; rank 0's is the rendezvous (--dist-init-addr)."""
        addresses = tuple(host.address for host in self.hosts_for(nnodes))
        return Placement(bind_hosts=addresses, leader_addr=addresses[0], port=port, dist_port=dist_port)

    @property
    def urls(self) -> tuple[str, ...]:
        """Each distinct engine once."""
        return tuple(dict.fromkeys(host.url for host in self.hosts))


def load_inventory(path: str | None, environ: Mapping[str, str]) -> Inventory:
    """The inventory from ``--hosts FILE``, else ``DSPARK_DOCKER_HOSTS``, else the local engine."""
    if path:
        return _from_file(path)
    if environ.get(HOSTS_ENV, "").strip():
        return _from_env(environ[HOSTS_ENV])
    url = environ.get("DOCKER_HOST") or DEFAULT_ENGINE
    return Inventory((_host(url, None, None, {}, "DOCKER_HOST" if environ.get("DOCKER_HOST") else "default", 0),),
                     source=f"the local engine ({url})", local_nodes_on_loopback=True)


def _from_env(text: str) -> Inventory:
    hosts = []
    for index, entry in enumerate(text.split()):
        url, _, address = entry.partition("=")
        hosts.append(_host(url, address or None, None, {}, HOSTS_ENV, index))
    return Inventory(tuple(hosts), source=HOSTS_ENV)


# How a hosts file that cannot be read or parsed is reported.
HOSTS_FILE = config_file_words("hosts inventory", "check --hosts (see docs/DOCKER.md for the format)")


def _from_file(path: str) -> Inventory:
    document = load_yaml(path, HOSTS_FILE)
    entries = document.get("hosts") if isinstance(document, dict) else None
    if not isinstance(entries, YamlList) or not entries:
        raise BadInput(f"{path}:{getattr(document, 'line', 1) or 1}",
                       "a hosts inventory needs a non-empty `hosts:` list",
                       "write `hosts:` followed by `- url: unix:///var/run/docker.sock` entries")
    hosts = []
    for index, entry in enumerate(entries):
        where = f"{path}:{entries.line_of(index)}"
        if not isinstance(entry, YamlMap) or "url" not in entry:
            raise BadInput(where, "each host needs a `url`", "e.g. `- url: ssh://user@node-1`")
        for key in entry:
            if key not in _HOST_KEYS:
                raise BadInput(f"{path}:{entry.line_of(key)}", f"unknown host key {key!r}",
                               f"known keys: {', '.join(_HOST_KEYS)}")
        hosts.append(_host(str(entry["url"]), entry.get("address"), entry.get("gpus"), entry.get("labels") or {},
                           where, index))
    return Inventory(tuple(hosts), source=path)


def _host(url: str, address, gpus, labels, where: str, index: int) -> DockerHost:
    parsed = urlparse(url)
    if parsed.scheme not in SCHEMES or not (parsed.path if parsed.scheme == "unix" else parsed.hostname):
        raise BadInput(where, f"{url!r} is not a Docker engine URL",
                       "use unix:///path/docker.sock, tcp://host:2375 or ssh://user@host")
    if gpus is not None and not _valid_gpus(gpus):
        raise BadInput(where, f"gpus must be a count or a list of device ids, each below {MAX_GPUS}, got {gpus!r}",
                       "e.g. `gpus: [0, 1]`")
    if not isinstance(labels, dict):
        raise BadInput(where, "labels must be a mapping", "e.g. `labels: {rack: a}`")
    # A local engine shares this machine's network: give each listed one its own loopback address.
    default_address = f"127.0.0.{index + 1}" if parsed.scheme == "unix" else parsed.hostname
    return DockerHost(url=url, address=str(address or default_address),
                      gpus=tuple(gpus) if isinstance(gpus, list) else gpus,
                      labels={str(k): str(v) for k, v in labels.items()}, where=where)


MAX_GPUS = 128  # per host, as a matrix's gpus_per_node (matrices/schema.py)


def _valid_gpus(gpus) -> bool:
    if isinstance(gpus, bool):
        return False
    if isinstance(gpus, int):
        return 0 <= gpus <= MAX_GPUS
    return isinstance(gpus, list) and len(gpus) <= MAX_GPUS and all(
        isinstance(g, int) and not isinstance(g, bool) and 0 <= g < MAX_GPUS for g in gpus)


def connect(url: str, timeout_s: float = 30.0) -> docker.DockerClient:
    """A client for one engine, proven to answer; InfraError (exit 3) saying what to check otherwise."""
    use_ssh = url.startswith("ssh://")
    try:
        client = docker.DockerClient(base_url=url, timeout=int(timeout_s), use_ssh_client=use_ssh)
        client.ping()
        return client
    except (docker.errors.DockerException, requests.RequestException, OSError) as err:
        raise InfraError(f"Docker engine {url} does not answer ({_first_line(err)}); check: "
                         f"{_what_to_check(url)}") from None


def _what_to_check(url: str) -> str:
    scheme = urlparse(url).scheme
    return {
        "unix": f"is dockerd running and is the socket readable? try `docker -H {url} info` "
                "(.ci/docker-up.sh starts the engines this project tests with)",
        "ssh": f"can this machine `ssh {url[len('ssh://'):]} docker info` without a password prompt?",
    }.get(scheme, f"is the engine listening there and reachable? try `docker -H {url} info`")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__


@contextlib.contextmanager
def clients(urls) -> Iterator[dict[str, docker.DockerClient]]:
    """One connected client per distinct engine URL, closed afterwards."""
    opened: dict[str, docker.DockerClient] = {}
    try:
        for url in dict.fromkeys(urls):
            opened[url] = connect(url)
        yield opened
    finally:
        for client in opened.values():
            with contextlib.suppress(Exception):
                client.close()
