"""How long the suites wait on a deployment before calling it stuck: a request's timeout and /health's silence,
both set so that a slow but working server (SGLang's engine on 2 shared CPU cores) is never called broken."""

from __future__ import annotations

from pathlib import Path

from dspark_ci.suite_runner import SuiteRequest, Watch


def test_a_request_that_shares_the_server_gets_the_time_of_the_batch_it_shares():
    # 96 tokens at concurrency 4 took over 84 s under STANDALONE on SGLang's CPU engine: a healthy server timed out.
    alone, shared = (SuiteRequest(base_url="http://127.0.0.1:1", names=("accept",), work_dir=Path("."),
                                  options={"accept": {"max_tokens": 96, "concurrency": c}}) for c in (1, 4))
    assert shared.request_timeout_s - alone.request_timeout_s >= 3 * 96 * 0.25


def test_a_cpu_deployment_may_be_silent_longer_than_sglangs_own_health_rule():
    # STANDALONE on 2 shared cores went 30 s without a token at load 12 and was called unresponsive while working.
    watch = Watch()
    assert watch.for_device("cuda").unresponsive_after_s == watch.unresponsive_after_s == 30.0
    assert watch.for_device("cpu").unresponsive_after_s >= 120.0
    assert Watch(unresponsive_after_s=600.0).for_device("cpu").unresponsive_after_s == 600.0  # never shortened
