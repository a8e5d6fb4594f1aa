"""`dspark-ci chatops` and `python -m dspark_ci.ci.chatops.rerun_status` for real, over HTTP, against a local stand-in
for GitHub's API (tests/github_standin.py, on 127.0.0.1): retries, rate limits, permission, pinning, races."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dspark_ci.cli import main
from tests.github_standin import GitHubStandIn
from tests.test_chatops import PERMISSIONS, REGISTERED, fleet_of_the_fixture_tree  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parent.parent
TOKEN = "stand-in-token"


@pytest.fixture
def sglang_repo(tmp_path: Path) -> Path:
    root = tmp_path / "sglang"
    for relative, text in REGISTERED.items():
        path = root / "test/registered" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def github(monkeypatch):
    with GitHubStandIn() as standin:
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        monkeypatch.setenv("GITHUB_API_URL", standin.url)
        standin.state.permissions.update({"maintainer": "write", "reader": "read"})
        # The head was pushed an hour ago: before any comment a test writes (a later push refuses the command).
        standin.push(standin.state.head_sha,
                     (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"))
        yield standin


@pytest.fixture
def permissions_file(tmp_path: Path) -> Path:
    path = tmp_path / "permissions.json"
    path.write_text(json.dumps(PERMISSIONS))
    return path


def event_file(tmp_path: Path, body: str, user: str = "maintainer", association: str = "MEMBER") -> Path:
    path = tmp_path / "event.json"
    path.write_text(json.dumps({
        "action": "created", "issue": {"number": 4242, "user": {"login": "someone"}, "pull_request": {}},
        "comment": {"id": 99, "body": body, "user": {"login": user}, "author_association": association,
                    "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "repository": {"full_name": "sgl-project/sglang", "default_branch": "main"}}))
    return path


def chatops(capsys, tmp_path, sglang_repo, permissions_file, body, user="maintainer", association="MEMBER"):
    code = main(["chatops", "--event", str(event_file(tmp_path, body, user, association)), "--repo-root",
                 str(sglang_repo), "--permissions", str(permissions_file), "--format", "json"])
    out, err = capsys.readouterr()
    return code, err


def the_reply(github: GitHubStandIn) -> str:
    bodies = [c["body"] for c in github.state.comments.values()]
    assert len(bodies) == 1, bodies
    return bodies[0]


TWO_GROUPS = "/rerun-test test_eagle_small.py test_dspark_tp8.py"


def test_one_502_on_dispatch_is_retried_and_succeeds(capsys, tmp_path, sglang_repo, permissions_file, github):
    github.fail("POST", "/dispatches$", 502, body="Bad Gateway")
    code, err = chatops(capsys, tmp_path, sglang_repo, permissions_file, TWO_GROUPS)
    assert (code, err) == (0, "")
    assert [d["inputs"]["runner"] for d in github.state.dispatches] == ["1-gpu-h100", "8-gpu-h200"]
    assert len(github.times_of("POST", "/dispatches")) == 3  # one 502, then both accepted
    assert the_reply(github).count("⏳ queued") == 2
    assert github.state.reactions == [(99, "+1")]


def test_the_dispatch_carries_the_resolved_tests_and_the_head_at_command_time(capsys, tmp_path, sglang_repo,
                                                                               permissions_file, github):
    code, _ = chatops(capsys, tmp_path, sglang_repo, permissions_file, "/rerun-test test_eagle_small.py::TestEagle")
    assert code == 0
    (dispatch,) = github.state.dispatches
    assert dispatch["ref"] == "main" and dispatch["workflow"] == "rerun-test.yml"
    assert json.loads(dispatch["inputs"]["tests"]) == [["registered/spec/test_eagle_small.py", "TestEagle"]]
    assert dispatch["inputs"]["sha"] == github.state.head_sha
    reply_id = next(iter(github.state.comments))
    assert dispatch["inputs"]["reply_comment_id"] == str(reply_id)


def test_a_dispatch_that_fails_is_not_shown_as_queued(capsys, tmp_path, sglang_repo, permissions_file, github):
    github.fail("POST", "/dispatches$", 422, body='{"message": "Unexpected inputs"}')  # the first group only
    code, err = chatops(capsys, tmp_path, sglang_repo, permissions_file, TWO_GROUPS)
    assert code == 3 and "not everything was carried out" in err and "Traceback" not in err
    reply = the_reply(github)
    assert "`1-gpu-h100` (1 test): ⚠️ not dispatched" in reply
    assert "`8-gpu-h200` (1 test): ⏳ queued" in reply
    assert [d["inputs"]["runner"] for d in github.state.dispatches] == ["8-gpu-h200"]


def test_a_failed_reaction_does_not_stop_the_command(capsys, tmp_path, sglang_repo, permissions_file, github):
    github.fail("POST", "/reactions$", 403, body='{"message": "Resource not accessible by integration"}')
    code, err = chatops(capsys, tmp_path, sglang_repo, permissions_file, TWO_GROUPS)
    assert code == 0 and "warning: reaction not added" in err
    assert len(github.state.dispatches) == 2


@pytest.mark.parametrize("headers, body", [
    pytest.param({"Retry-After": "1"}, '{"message": "You have exceeded a secondary rate limit."}', id="retry-after"),
    pytest.param({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "{reset}"}, '{"message": "API rate limit"}',
                 id="ratelimit-reset"),
])
def test_rate_limits_are_waited_out(capsys, tmp_path, sglang_repo, permissions_file, github, headers, body):
    headers = {k: v.format(reset=int(time.time()) + 3) for k, v in headers.items()}
    github.fail("POST", "/dispatches$", 403, headers=headers, body=body)
    code, _ = chatops(capsys, tmp_path, sglang_repo, permissions_file, "/rerun-test test_eagle_small.py")
    assert code == 0 and len(github.state.dispatches) == 1
    first, second = github.times_of("POST", "/dispatches")
    assert second - first >= 0.9


def test_a_rate_limit_longer_than_the_bound_fails_at_once(capsys, tmp_path, sglang_repo, permissions_file, github):
    github.fail("POST", "/dispatches$", 429, headers={"Retry-After": "3600"}, body="slow down")
    started = time.monotonic()
    code, err = chatops(capsys, tmp_path, sglang_repo, permissions_file, "/rerun-test test_eagle_small.py")
    assert code == 3 and time.monotonic() - started < 10
    assert "⚠️ not dispatched" in the_reply(github)


@pytest.mark.parametrize("user, association, permission, expected", [
    pytest.param("maintainer", "MEMBER", "write", 0, id="write"),
    pytest.param("reader", "MEMBER", "read", 1, id="member-with-read-only"),
    pytest.param("outsider", "COLLABORATOR", None, 1, id="not-a-collaborator"),
    pytest.param("admin", "CONTRIBUTOR", "admin", 0, id="admin-whatever-the-association"),
])
def test_write_access_is_the_repositorys_answer_not_the_association(capsys, tmp_path, sglang_repo, permissions_file,
                                                                    github, user, association, permission, expected):
    if permission:
        github.state.permissions[user] = permission
    code, _ = chatops(capsys, tmp_path, sglang_repo, permissions_file, "/rerun-test test_eagle_small.py", user,
                      association)
    assert code == expected
    assert bool(github.state.dispatches) == (expected == 0)
    if expected:
        assert f"your permission is {permission or 'none'}" in the_reply(github)


def test_cooldown_counts_from_the_bots_last_accepted_reply(capsys, tmp_path, sglang_repo, permissions_file, github):
    recent = (datetime.now(timezone.utc) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    github.add_comment("🔁 Rerunning ...\n<!--chatops:accepted:helper-->", created_at=recent)
    # The same marker written by a person proves nothing.
    github.add_comment("<!--chatops:accepted:maintainer-->", user={"login": "maintainer", "type": "User"},
                       created_at=recent)
    code, _ = chatops(capsys, tmp_path, sglang_repo, permissions_file, "/rerun-failed-ci", "helper", "NONE")
    assert code == 1
    assert "Your cooldown is 60 minutes" in github.state.comments[max(github.state.comments)]["body"]


def test_silence_for_a_comment_that_is_no_command(capsys, tmp_path, sglang_repo, permissions_file, github):
    code, _ = chatops(capsys, tmp_path, sglang_repo, permissions_file, "/lgtm @org/everyone", "stranger", "NONE")
    assert code == 2 and github.state.comments == {} and github.state.dispatches == []


def rerun_status(github: GitHubStandIn, comment_id: int, marker: str, status: str) -> subprocess.Popen:
    env = {**os.environ, "GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": github.url, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "dspark_ci.ci.chatops.rerun_status", "--repo", "sgl-project/sglang",
                             "--comment-id",
                             str(comment_id), "--marker", marker, "--status", status, "--run-url",
                             f"https://ci.example/runs/{marker[8]}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_concurrent_status_updates_both_land(github):
    reply = ("🚀 `1-gpu-h100` (1 test): 🔄 running <!--rrt:0-->\n```\ncd test/ && python3 a.py\n```\n\n"
             "🚀 `8-gpu-h200` (1 test): 🔄 running <!--rrt:1-->\n```\ncd test/ && python3 b.py\n```\n")
    comment_id = github.add_comment(reply)
    github.hold_reads(2)  # both writers read the same body: a plain read-modify-write would lose one
    writers = [rerun_status(github, comment_id, "<!--rrt:0-->", "success"),
               rerun_status(github, comment_id, "<!--rrt:1-->", "failure")]
    for writer in writers:
        _, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err
    body = github.state.comments[comment_id]["body"]
    assert "`1-gpu-h100` (1 test): ✅ [View workflow run](https://ci.example/runs/0) <!--rrt:0:done-->" in body
    assert "`8-gpu-h200` (1 test): ❌ [View workflow run](https://ci.example/runs/1) <!--rrt:1:done-->" in body
    assert len(github.times_of("PATCH", "/issues/comments/")) >= 3  # the overwritten line was written again
