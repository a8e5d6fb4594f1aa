"""Facts of SGLang's router (PyPI ``sglang-router``, a Rust build) as a PD cell uses it.

0.3.2 is the newest release on PyPI and the one dspark-ci pins (``pip install 'dspark-ci[pd]'``). What it does
with a prefill/decode pair, read from its traffic against the simulator (tests/test_pd_router.py):
- it checks every worker's ``/health`` and reads ``/server_info`` and ``/model_info`` when it registers it;
- it forwards each OpenAI or native request to one prefill AND one decode server at once, adding
  ``bootstrap_host`` (the prefill URL's host), ``bootstrap_port`` (the one given after the prefill URL) and a random
  ``bootstrap_room`` to the body, and answers with the decode server's response, byte for byte;
- it rebuilds the request from its own schema: fields it does not know are dropped. For chat completions that
  includes SGLang's ``return_spec_tokens_details`` and ``return_meta_info`` (kept for ``/v1/completions``), so
  per-request speculative statistics through the router come from completions, or from the decode servers;
- its own ``/server_info`` is empty and ``/get_server_info`` describes the router, not the servers.
"""

from __future__ import annotations

ROUTER_PACKAGE = "sglang-router"
ROUTER_VERSION = "0.3.2"
ROUTER_ENTRYPOINT = ("python3", "-m", "sglang_router.launch_router")
# launch_router.py --help of 0.3.2
PREFILL_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual", "bucket")
DECODE_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")
DEFAULT_POLICY = "round_robin"  # repeatable across runs (cache_aware, its own default, depends on timing)
ROLES = ("prefill", "decode")


def router_args(host: str, port: int, prefills: list[tuple[str, int]], decodes: list[str],
                prefill_policy: str, decode_policy: str, prometheus_port: int | None = None) -> list[str]:
    """launch_router's flags for one PD group: each prefill URL followed by its bootstrap port. The router always
    serves Prometheus metrics (default port 29000): two routers on one machine need their own ports."""
    argv = ["--host", host, "--port", str(port), "--pd-disaggregation"]
    if prometheus_port is not None:
        argv += ["--prometheus-host", host, "--prometheus-port", str(prometheus_port)]
    for url, bootstrap_port in prefills:
        argv += ["--prefill", url, str(bootstrap_port)]
    for url in decodes:
        argv += ["--decode", url]
    return argv + ["--prefill-policy", prefill_policy, "--decode-policy", decode_policy]
