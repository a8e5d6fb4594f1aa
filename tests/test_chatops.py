"""`dspark-ci chatops`: what a PR commenter sees (reply, exit code) and what would be dispatched.

Everything runs against a fake SGLang tree in tmp_path and in dry-run: no test here reaches GitHub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from dspark_ci.ci.chatops.text import shown

from dspark_ci.cli import main
from tests.golden_files import GOLDEN_DIR, assert_golden

GOLDEN = GOLDEN_DIR / "ci"

# A fake SGLang checkout: test/registered/** with register_*_ci calls as SGLang writes them.
REGISTERED = {
    "spec/test_dflash_dp_attention.py":
        'register_cuda_ci(est_time=300, stage="stage-c", runner_config="4-gpu-h100")\n',
    "unit/spec/test_dflash_dp_attention.py":
        'register_cuda_ci(est_time=30, suite="stage-b-test-large-1-gpu")\n',
    "spec/test_dspark_tp8.py":
        'register_cuda_ci(est_time=900, stage="nightly", runner_config="8-gpu-h200")\n',
    "spec/test_dspark_dp_attention.py":
        'register_cuda_ci(900, "nightly-8-gpu-h200", True)\nregister_amd_ci(est_time=900, suite="nightly-amd-8-gpu-mi35x")\n',
    "spec/test_eagle_small.py":
        'from sglang.test.ci.ci_register import register_cuda_ci\n\n'
        'register_cuda_ci(est_time=60, stage="base-b", runner_config="1-gpu-large")\n\n'
        'class TestEagle:\n    def test_gsm8k(self):\n        pass\n',
    "npu/test_dspark_npu.py": 'register_npu_ci(est_time=400, suite="nightly-16-npu-a3", nightly=True)\n',
    "amd/test_dspark_amd.py": 'register_amd_ci(est_time=15, stage="stage-b", runner_config="1-gpu-small-amd-mi35x")\n',
    "cpu/test_ci_register.py": 'register_cpu_ci(est_time=5, suite="stage-a-test-cpu")\n',
    "spec/test_disabled.py": 'register_cuda_ci(est_time=5, suite="nightly-1-gpu", disabled="flaky on H100")\n',
    "spec/test_unregistered.py": "import unittest\n",
    "spec/test_broken.py": "register_cuda_ci(est_time=5,\n",
    # Reading a registration must never run the file.
    "spec/test_side_effect.py":
        'import pathlib\npathlib.Path("SIDE_EFFECT_RAN").write_text("x")\n'
        'register_cuda_ci(est_time=5, stage="base-b", runner_config="1-gpu-large")\n',
    "spec/helpers.py": 'register_cuda_ci(est_time=5, stage="base-b", runner_config="1-gpu-large")\n',
}
OUTSIDE = {"manual/test_manual.py": 'register_cuda_ci(est_time=5, stage="base-b", runner_config="1-gpu-large")\n'}

# Runner labels the fixture tree names that ci/nightly/fleet.json does not: this repository's fleet, for these tests.
FIXTURE_RUNNERS = {"1-gpu-h100": 2, "1-gpu-mi35x": 1}


@pytest.fixture(autouse=True)
def fleet_of_the_fixture_tree(tmp_path_factory, monkeypatch):
    from dspark_ci.ci.chatops import fleet

    path = tmp_path_factory.mktemp("fleet") / "fleet.json"
    path.write_text(json.dumps({**json.loads(fleet.DEFAULT_FLEET.read_text()), **FIXTURE_RUNNERS}))
    monkeypatch.setattr(fleet, "DEFAULT_FLEET", path)
    return path


PERMISSIONS = {
    "maintainer": {"can_tag_run_ci_label": True, "can_rerun_failed_ci": True, "cooldown_interval_minutes": 0},
    "helper": {"can_rerun_failed_ci": True, "cooldown_interval_minutes": 60, "reason": "top contributor"},
    "zero-cooldown": {"cooldown_interval_minutes": 0},
}


@pytest.fixture
def sglang_repo(tmp_path: Path) -> Path:
    root = tmp_path / "sglang"
    for base, files in (("test/registered", REGISTERED), ("test", OUTSIDE)):
        for relative, text in files.items():
            path = root / base / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root


@pytest.fixture
def permissions_file(tmp_path: Path) -> Path:
    path = tmp_path / "permissions.json"
    path.write_text(json.dumps(PERMISSIONS, indent=2))
    return path


@pytest.fixture(autouse=True)
def no_github(monkeypatch):
    """Fail any test that would reach the network; start every test without a token."""
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)

    def refuse(*args, **kwargs):
        raise AssertionError(f"a test tried to call the network: {args} {kwargs}")

    monkeypatch.setattr(requests, "request", refuse)
    monkeypatch.setattr(requests.Session, "request", refuse)


def chatops(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["chatops", *argv])
    except SystemExit as exit_:  # argparse's own usage errors
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def chatops_json(capsys, sglang_repo: Path, permissions_file: Path, comment: str, user="maintainer",
                 association="MEMBER", *extra: str) -> tuple[int, dict, str]:
    code, out, err = chatops(capsys, "--comment", comment, "--user", user, "--author-association", association,
                             "--repo-root", str(sglang_repo), "--permissions", str(permissions_file),
                             "--pr", "4242", "--repo", "sgl-project/sglang", "--format", "json", "--dry-run",
                             *extra)
    return code, json.loads(out), err


def dispatched(result: dict) -> dict[str, list[str]]:
    """runner label -> test commands, from the dispatch plan."""
    return {action["inputs"]["runner"]: [" ".join(argv) for argv in json.loads(action["inputs"]["tests"])]
            for action in result["plan"]["actions"]
            if action["type"] == "workflow_dispatch" and action["workflow"] == "rerun-test.yml"}


# --- /rerun-test: resolving specs to files and runners ----------------------------------------

@pytest.mark.parametrize("comment, expected", [
    pytest.param("/rerun-test test_eagle_small.py",
                 {"1-gpu-h100": ["registered/spec/test_eagle_small.py"]}, id="bare-name"),
    pytest.param("/rerun-test registered/spec/test_dspark_tp8.py",
                 {"8-gpu-h200": ["registered/spec/test_dspark_tp8.py"]}, id="path-from-test-dir"),
    pytest.param("/rerun-test test/registered/unit/spec/test_dflash_dp_attention.py",
                 {"1-gpu-h100": ["registered/unit/spec/test_dflash_dp_attention.py"]}, id="full-path"),
    pytest.param("/rerun-test test_eagle_small.py::TestEagle.test_gsm8k",
                 {"1-gpu-h100": ["registered/spec/test_eagle_small.py TestEagle.test_gsm8k"]}, id="class-test-selector"),
    pytest.param("/rerun-test test_eagle_small.py::TestEagle",
                 {"1-gpu-h100": ["registered/spec/test_eagle_small.py TestEagle"]}, id="class-selector"),
    pytest.param("/rerun-test test_dspark_*.py",
                 {"1-gpu-mi35x": ["registered/amd/test_dspark_amd.py"],
                  "16-npu-a3": ["registered/npu/test_dspark_npu.py"],
                  "8-gpu-h200": ["registered/spec/test_dspark_dp_attention.py", "registered/spec/test_dspark_tp8.py"]},
                 id="wildcard-bare-name-groups-by-runner"),
    pytest.param("/rerun-test registered/spec/test_dflash_*.py",
                 {"4-gpu-h100": ["registered/spec/test_dflash_dp_attention.py"]}, id="wildcard-in-path"),
    pytest.param("/rerun-test test/registered/spec/test_dspark_tp?.py",
                 {"8-gpu-h200": ["registered/spec/test_dspark_tp8.py"]}, id="question-mark-wildcard"),
    pytest.param("/rerun-test test_ci_register.py", {"ubuntu-latest": ["registered/cpu/test_ci_register.py"]},
                 id="cpu-registration"),
    pytest.param("/rerun-test test_dspark_tp8.py registered/spec/test_dspark_tp8.py",
                 {"8-gpu-h200": ["registered/spec/test_dspark_tp8.py"]}, id="same-file-twice-runs-once"),
    pytest.param("/rerun-test test_eagle_small.py\nplease also /rerun-test test_dspark_tp8.py",
                 {"1-gpu-h100": ["registered/spec/test_eagle_small.py"]}, id="only-first-line-counts"),
])
def test_rerun_test_resolves_files_and_groups_by_runner(capsys, sglang_repo, permissions_file, comment, expected):
    code, result, err = chatops_json(capsys, sglang_repo, permissions_file, comment)
    assert (code, err) == (0, "")
    assert dispatched(result) == expected


def test_cuda_registration_wins_over_amd_in_the_same_file(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_dspark_dp_attention.py")
    assert code == 0
    assert [a["inputs"]["backend"] for a in result["plan"]["actions"]] == ["cuda"]


def test_registrations_are_read_without_running_the_file(capsys, sglang_repo, permissions_file, monkeypatch):
    monkeypatch.chdir(sglang_repo)
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_side_effect.py")
    assert dispatched(result) == {"1-gpu-h100": ["registered/spec/test_side_effect.py"]}
    assert not list(sglang_repo.rglob("SIDE_EFFECT_RAN"))


def test_ambiguous_bare_name_is_refused_and_nothing_runs(capsys, sglang_repo, permissions_file):
    code, result, err = chatops_json(capsys, sglang_repo, permissions_file,
                                     "/rerun-test test_dflash_dp_attention.py test_eagle_small.py")
    assert code == 2
    assert result["plan"]["actions"] == []
    assert result["reply"].startswith(
        "⛔ test_dflash_dp_attention.py: Ambiguous filename test_dflash_dp_attention.py — matched 2 files: ")
    assert "Please provide the full path, e.g. /rerun-test test/registered/" in result["reply"]
    assert "Ambiguous filename" in err
    assert_golden(GOLDEN / "reply_ambiguous.md", result["reply"])


@pytest.mark.parametrize("spec, reason", [
    pytest.param("test_nothing_here.py", "No test file found matching test_nothing_here.py under test/registered/",
                 id="bare-name-not-found"),
    pytest.param("registered/spec/test_nothing_here.py", "File not found: test/registered/spec/test_nothing_here.py",
                 id="path-not-found"),
    pytest.param("test_nothing_*.py", "No test file found matching test_nothing_*.py", id="wildcard-matches-nothing"),
    pytest.param("helpers.py", "No test file found matching helpers.py", id="not-a-test-file"),
    pytest.param("test/manual/test_manual.py", "only tests under test/registered/ can be rerun",
                 id="outside-registered"),
    pytest.param("test_unregistered.py", "No register_cuda_ci() / register_npu_ci() / register_amd_ci() / "
                 "register_cpu_ci() call found in test/registered/spec/test_unregistered.py", id="not-registered"),
    pytest.param("test_disabled.py", "registered but disabled (flaky on H100)", id="disabled"),
    pytest.param("test_broken.py", "test/registered/spec/test_broken.py:1: cannot be parsed", id="syntax-error"),
    pytest.param("test_dspark_*.py::TestX", "matched 4 files; a ::TestX selector needs exactly one",
                 id="selector-on-several-files"),
])
def test_unresolvable_spec_is_refused_with_reason(capsys, sglang_repo, permissions_file, spec, reason):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, f"/rerun-test test_eagle_small.py {spec}")
    assert code == 2
    assert result["plan"]["actions"] == []
    assert f"⛔ {spec}: " in result["reply"] and reason in result["reply"]
    assert "Nothing was dispatched" in result["reply"]


def test_wildcard_cannot_turn_one_comment_into_a_suite_run(capsys, sglang_repo, permissions_file):
    for i in range(21):
        (sglang_repo / "test/registered/spec" / f"test_many_{i:02d}.py").write_text(
            'register_cuda_ci(est_time=5, stage="base-b", runner_config="1-gpu-large")\n')
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_many_*.py")
    assert code == 2
    assert "match more than 20 test files; at most 20 tests and matrix cells run per comment" in result["reply"]
    assert result["plan"]["actions"] == []


# --- the allow-list: what never reaches a runner ----------------------------------------------

@pytest.mark.parametrize("spec, reason", [
    pytest.param("test_x.py;rm", "contains ;", id="semicolon"),
    pytest.param("$(id).py", "contains $ ( )", id="command-substitution"),
    pytest.param("`id`.py", "contains `", id="backticks"),
    pytest.param("test_x.py|sh", "contains |", id="pipe"),
    pytest.param("test_x.py&&curl", "contains &", id="and-and"),
    pytest.param("test_x.py>out", "contains >", id="redirect"),
    pytest.param("~/test_x.py", "contains ~", id="home"),
    pytest.param("'test_x.py'", "contains '", id="quote"),
    pytest.param("test_x.py::TestX;id", "contains ;", id="metachar-in-selector"),
    pytest.param("../test_x.py", ".. is not allowed", id="parent-dir"),
    pytest.param("registered/../../etc/test_x.py", ".. is not allowed", id="parent-dir-inside-path"),
    pytest.param("/etc/test_x.py", "absolute paths are not allowed", id="absolute-path"),
    pytest.param("test_x.py::Test*", "after :: give TestClass or TestClass.test_method", id="wildcard-selector"),
    pytest.param("test_x.py::", "after :: give TestClass", id="empty-selector"),
    pytest.param("::TestX", "no test file before ::", id="selector-without-file"),
])
def test_unsafe_spec_is_rejected_before_any_file_is_read(capsys, sglang_repo, permissions_file, spec, reason):
    code, result, err = chatops_json(capsys, sglang_repo, permissions_file, f"/rerun-test {spec}")
    assert code == 2
    assert result["plan"]["actions"] == []
    # The spec is echoed inert (entities for < > &, backslashes before `): dspark_ci.ci.chatops.text.shown.
    assert result["reply"].startswith(f"⛔ {shown(spec)}: ") and shown(reason) in result["reply"]
    assert err.startswith("dspark-ci chatops: --comment: ")


def test_every_bad_spec_is_named_in_one_reply(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test a;b.py ../c.py test_ok.py")
    assert code == 2
    assert "⛔ a;b.py: contains ;" in result["reply"] and "⛔ ../c.py: .. is not allowed" in result["reply"]


@pytest.mark.parametrize("comment, reason", [
    pytest.param("/tag-run-ci-label now", "/tag-run-ci-label takes no arguments", id="arguments-to-plain-command"),
    pytest.param("/rerun-test", "/rerun-test needs at least one test", id="rerun-test-without-tests"),
    pytest.param("/rerun-test " + " ".join(f"test_{i}.py" for i in range(21)), "at most 20 tests",
                 id="too-many-tests"),
])
def test_comment_that_is_not_a_command_is_rejected(capsys, sglang_repo, permissions_file, comment, reason):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, comment)
    assert code == 2
    assert reason in result["reply"]
    assert result["plan"]["actions"] == []


@pytest.mark.parametrize("comment", [
    pytest.param("/deploy-to-prod @org/everyone", id="unknown-command"),
    pytest.param("LGTM\n/rerun-test test_eagle_small.py", id="command-not-on-first-line"),
    pytest.param("", id="empty-comment"),
])
def test_a_comment_that_is_no_command_of_ours_gets_no_reply(capsys, sglang_repo, permissions_file, comment):
    code, result, err = chatops_json(capsys, sglang_repo, permissions_file, comment, "stranger", "NONE")
    assert (code, result["reply"], result["plan"]["actions"]) == (2, "", [])
    assert "not a command (no reply)" in err


def test_a_near_miss_gets_did_you_mean_without_echoing_the_comment(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, "/rerun-tests @org/everyone @alice",
                                   "stranger", "NONE")
    assert code == 2
    assert "did you mean /rerun-test?" in result["reply"]
    assert "@" not in result["reply"] and "everyone" not in result["reply"]


def test_an_unauthorised_users_words_are_never_echoed(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test @org/everyone;x test_@bob.py",
                                   "stranger", "NONE")
    assert code == 1
    assert result["reply"].startswith("⛔ @stranger: /rerun-test runs PR code")
    assert "everyone" not in result["reply"] and "bob" not in result["reply"]


def test_mentions_in_an_authorised_users_refused_specs_are_neutralised(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test @org/everyone")
    assert code == 2
    assert "@org" not in result["reply"] and "@\u200borg/everyone" in result["reply"]


# --- permissions -------------------------------------------------------------------------------

@pytest.mark.parametrize("comment, user, association, pr_author, expected_code", [
    pytest.param("/tag-run-ci-label", "maintainer", "NONE", "someone", 0, id="tag-with-permission"),
    pytest.param("/tag-run-ci-label", "helper", "MEMBER", "someone", 1, id="tag-without-permission"),
    pytest.param("/tag-run-ci-label", "author", "CONTRIBUTOR", "author", 1, id="tag-by-pr-author-needs-permission"),
    pytest.param("/rerun-failed-ci", "helper", "NONE", "someone", 0, id="rerun-failed-with-permission"),
    pytest.param("/rerun-failed-ci", "author", "CONTRIBUTOR", "author", 0, id="rerun-failed-own-pr"),
    pytest.param("/rerun-failed-ci", "stranger", "NONE", "someone", 1, id="rerun-failed-stranger"),
    pytest.param("/tag-and-rerun-ci", "maintainer", "NONE", "someone", 0, id="tag-and-rerun-with-both"),
    pytest.param("/tag-and-rerun-ci", "helper", "NONE", "someone", 1, id="tag-and-rerun-missing-tag"),
    pytest.param("/rerun-test test_eagle_small.py", "collaborator", "COLLABORATOR", "someone", 0,
                 id="rerun-test-write-access"),
    pytest.param("/rerun-test test_eagle_small.py", "owner", "owner", "someone", 0,
                 id="rerun-test-association-any-case"),
    pytest.param("/rerun-test test_eagle_small.py", "zero-cooldown", "NONE", "someone", 0,
                 id="rerun-test-zero-cooldown"),
    pytest.param("/rerun-test test_eagle_small.py", "helper", "CONTRIBUTOR", "someone", 1,
                 id="rerun-test-nonzero-cooldown"),
    pytest.param("/rerun-test test_eagle_small.py", "author", "CONTRIBUTOR", "author", 1,
                 id="rerun-test-pr-author-is-not-enough"),
])
def test_permission_decides_exit_code_and_reply(capsys, sglang_repo, permissions_file, comment, user,
                                                association, pr_author, expected_code):
    code, result, err = chatops_json(capsys, sglang_repo, permissions_file, comment, user, association,
                                     "--pr-author", pr_author)
    assert code == expected_code
    if expected_code:
        assert result["reply"].startswith(f"⛔ @{user}: ")
        assert result["plan"]["actions"] == []
        assert "refused" in err
    else:
        assert result["plan"]["actions"] and not err


def test_refused_permission_is_decided_before_reading_any_test_file(capsys, tmp_path, permissions_file):
    # No SGLang tree at all: a stranger's /rerun-test is refused on permission, not on --repo-root.
    code, result, _ = chatops_json(capsys, tmp_path / "missing", permissions_file, "/rerun-test test_x.py",
                                   "stranger", "NONE")
    assert code == 1
    assert_golden(GOLDEN / "reply_refused.md", result["reply"])


# --- event files, goldens for reply and plan ----------------------------------------------------

def issue_comment_event(body: str, *, user="maintainer", association="MEMBER", pr_author="someone",
                        pull_request=True) -> dict:
    issue = {"number": 4242, "user": {"login": pr_author}}
    if pull_request:
        issue["pull_request"] = {"url": "https://api.github.invalid/repos/sgl-project/sglang/pulls/4242"}
    return {"action": "created", "issue": issue,
            "comment": {"id": 99, "body": body, "user": {"login": user}, "author_association": association},
            "repository": {"full_name": "sgl-project/sglang", "default_branch": "main"}}


def test_event_file_rerun_test_reply_and_plan_match_goldens(capsys, tmp_path, sglang_repo, permissions_file):
    event = tmp_path / "event.json"
    event.write_text(json.dumps(issue_comment_event(
        "/rerun-test test/registered/spec/test_dflash_dp_attention.py test_eagle_small.py::TestEagle.test_gsm8k "
        "test_dspark_*.py\n\nThe DFlash test flaked on the last run.")))
    code, out, err = chatops(capsys, "--event", str(event), "--repo-root", str(sglang_repo),
                             "--permissions", str(permissions_file), "--dry-run", "--format", "json")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert result["dry_run"] is True
    assert_golden(GOLDEN / "reply_rerun_test.md", result["reply"])
    assert_golden(GOLDEN / "plan_rerun_test.json", json.dumps(result["plan"], indent=2, ensure_ascii=False) + "\n")


def test_text_output_shows_reply_then_plan(capsys, tmp_path, permissions_file):
    event = tmp_path / "event.json"
    event.write_text(json.dumps(issue_comment_event("/tag-and-rerun-ci")))
    code, out, _ = chatops(capsys, "--event", str(event), "--permissions", str(permissions_file), "--dry-run")
    assert code == 0
    assert_golden(GOLDEN / "chatops_tag_and_rerun.txt", out)


@pytest.mark.parametrize("content, message", [
    pytest.param("{not json", "event.json:1: not valid JSON", id="not-json"),
    pytest.param(json.dumps({"action": "opened", "pull_request": {}}), "no 'comment' object", id="wrong-event-kind"),
    pytest.param(json.dumps(issue_comment_event("/rerun-failed-ci", pull_request=False)),
                 "issue #4242 is not a pull request", id="comment-on-issue"),
    pytest.param(json.dumps({**issue_comment_event("x"), "comment": {"body": 5, "user": {"login": "a"}}}),
                 "comment.body is missing or not a str", id="body-not-text"),
])
def test_bad_event_file_exits_2_naming_the_file(capsys, tmp_path, permissions_file, content, message):
    event = tmp_path / "event.json"
    event.write_text(content)
    code, out, err = chatops(capsys, "--event", str(event), "--permissions", str(permissions_file), "--dry-run")
    assert (code, out) == (2, "")
    assert message in err and "Traceback" not in err


def test_missing_event_file_exits_2(capsys, tmp_path):
    code, _, err = chatops(capsys, "--event", str(tmp_path / "nope.json"), "--dry-run")
    assert code == 2 and "nope.json: cannot read the event file" in err


@pytest.mark.parametrize("content, message", [
    pytest.param('{\n  "alice": {"can_rerun_failed_ci": true,}\n}', "permissions.json:2: not valid JSON", id="syntax"),
    pytest.param('["alice"]', "must be a JSON object mapping GitHub logins", id="not-an-object"),
    pytest.param('{"alice": true}', "entry for 'alice' must be an object", id="entry-not-object"),
    pytest.param('{"alice": {"can_rerun_failed_ci": "yes"}}', 'alice.can_rerun_failed_ci is "yes"', id="flag-not-bool"),
    pytest.param('{"alice": {"cooldown_interval_minutes": true}}', "alice.cooldown_interval_minutes is true",
                 id="cooldown-bool"),
    pytest.param('{"alice": {"cooldown_interval_minutes": -5}}', "alice.cooldown_interval_minutes is -5",
                 id="cooldown-negative"),
])
def test_bad_permissions_file_exits_2_naming_the_file(capsys, tmp_path, content, message):
    path = tmp_path / "permissions.json"
    path.write_text(content)
    code, out, err = chatops(capsys, "--comment", "/rerun-failed-ci", "--user", "alice", "--permissions", str(path),
                             "--dry-run")
    assert (code, out) == (2, "")
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--comment", "/rerun-failed-ci"], "--comment: needs --user LOGIN", id="comment-without-user"),
    pytest.param(["--comment", "/rerun-test test_x.py", "--user", "maintainer", "--author-association", "MEMBER"],
                 "--repo-root: ", id="repo-root-without-sglang-tests"),
    pytest.param([], "one of the arguments --event --comment is required", id="no-source"),
])
def test_bad_arguments_exit_2(capsys, tmp_path, permissions_file, argv, message):
    code, _, err = chatops(capsys, *argv, "--repo-root", str(tmp_path), "--permissions", str(permissions_file),
                           "--dry-run")
    assert code == 2 and message in err


def test_without_dry_run_a_missing_token_is_refused_before_anything_else(capsys, sglang_repo, permissions_file):
    code, out, err = chatops(capsys, "--comment", "/rerun-test test_eagle_small.py", "--user", "maintainer",
                             "--repo-root", str(sglang_repo), "--permissions", str(permissions_file), "--pr", "1",
                             "--repo", "sgl-project/sglang")
    assert (code, out) == (2, "")
    assert "GITHUB_TOKEN: not set" in err and "--dry-run" in err


def test_console_script_end_to_end(tmp_path, sglang_repo, permissions_file):
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_TOKEN"}
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_ci", "chatops", "--comment", "/rerun-test test_dflash_dp_attention.py",
         "--user", "maintainer", "--author-association", "MEMBER", "--repo-root", str(sglang_repo),
         "--permissions", str(permissions_file), "--dry-run"],
        capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert "Ambiguous filename test_dflash_dp_attention.py — matched 2 files" in proc.stdout
    assert "Traceback" not in proc.stderr


# --- hostile input: every one a refusal (exit 2), never a traceback, in bounded time ----------------

# A hostile comment (a catastrophic glob, a huge tree) must be refused in bounded time: the timing is the behaviour.
# Unbounded matching takes minutes; an answer takes well under a second on a quiet machine (bench/chatops_tree.py),
# so the bound leaves a loaded 2-core machine ample room and still catches a blow-up.
HOSTILE_WITHIN_S = 20.0


def timed_chatops_json(capsys, sglang_repo, permissions_file, comment, *extra):
    started = time.monotonic()
    code, result, err = chatops_json(capsys, sglang_repo, permissions_file, comment, "maintainer", "MEMBER", *extra)
    took = time.monotonic() - started
    assert took < HOSTILE_WITHIN_S, f"{comment[:60]!r} took {took:.1f} s"
    return code, result, err


def test_a_symlinked_test_root_is_refused(capsys, tmp_path, sglang_repo, permissions_file):
    outside = tmp_path / "outside" / "registered"
    outside.mkdir(parents=True)
    (outside / "test_evil.py").write_text('register_cuda_ci(est_time=5, runner_config="8-gpu-h200")\n')
    registered = sglang_repo / "test" / "registered"
    registered.rename(sglang_repo / "test" / "was_registered")
    registered.symlink_to(outside)
    code, result, err = timed_chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_*.py")
    assert (code, result["plan"]["actions"]) == (2, [])
    assert "test/registered is a symlink: refused" in result["reply"] and "test_evil" not in result["reply"]


def test_a_symlinked_test_file_or_folder_is_never_planned(capsys, tmp_path, sglang_repo, permissions_file):
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "test_secret.py").write_text('register_cuda_ci(est_time=5, runner_config="8-gpu-h200")\n')
    spec_dir = sglang_repo / "test" / "registered" / "spec"
    (spec_dir / "test_linked.py").symlink_to(tmp_path / "secret" / "test_secret.py")
    (spec_dir / "root").symlink_to("/")
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_linked.py")
    assert (code, result["plan"]["actions"]) == (2, [])
    assert "test/registered/spec/test_linked.py is a symlink: refused" in result["reply"]
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file,
                                         "/rerun-test registered/spec/root/**/test_*.py")
    assert (code, result["plan"]["actions"]) == (2, [])
    assert "File not found" in result["reply"] and "etc" not in result["reply"]


@pytest.mark.parametrize("spec, reason", [
    pytest.param("registered/" + "**/" * 40 + "test_x.py", "wildcards; at most 4", id="nested-recursive-globs"),
    pytest.param("registered/**/**/test_x.py", "at most 1 ** segment", id="two-recursive-globs"),
    pytest.param("t" * 320 + ".py", "characters long; at most 200", id="huge-name"),
    pytest.param("registered/" + "a/" * 100 + "test_x.py", "characters long; at most 200", id="huge-path"),
    pytest.param("*a*a*a*a*a*.py", "wildcards; at most 4", id="too-many-wildcards"),
    pytest.param("registered/spec**/test_x.py", "** must be a whole path segment", id="partial-recursive"),
])
def test_pathological_specs_are_refused(capsys, sglang_repo, permissions_file, spec, reason):
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file, f"/rerun-test {spec}")
    assert (code, result["plan"]["actions"]) == (2, [])
    assert reason in result["reply"]


def test_one_recursive_glob_is_allowed(capsys, sglang_repo, permissions_file):
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file,
                                         "/rerun-test registered/**/test_dspark_tp?.py")
    assert (code, dispatched(result)) == (0, {"8-gpu-h200": ["registered/spec/test_dspark_tp8.py"]})


@pytest.mark.parametrize("content, reason", [
    pytest.param("x = " + "(" * 100_000 + ")" * 100_000 + "\n", "cannot be parsed", id="200-kB-of-nesting"),
    pytest.param("#" * 300_000 + "\n", "larger than 256 kB: not read", id="huge-file"),
    pytest.param("register_cuda_ci(est_time=5)\x00\n", "cannot be parsed", id="nul-byte"),
    pytest.param("register_cuda_ci(est_time=1e999, runner_config='1-gpu-large')\n", None, id="absurd-est-time"),
])
def test_hostile_test_files_are_refused_or_read_safely(capsys, sglang_repo, permissions_file, content, reason):
    (sglang_repo / "test/registered/spec/test_hostile.py").write_text(content)
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_hostile.py")
    if reason is None:
        assert code == 0
    else:
        assert (code, result["plan"]["actions"]) == (2, [])
        assert reason in result["reply"]


def test_a_fifo_named_like_a_test_does_not_hang(capsys, sglang_repo, permissions_file):
    os.mkfifo(sglang_repo / "test/registered/spec/test_fifo.py")
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_fifo.py")
    assert code == 2 and "No test file found matching test_fifo.py" in result["reply"]


@pytest.mark.parametrize("name", [
    pytest.param("test_a b.py", id="space"),
    pytest.param("test_a;id.py", id="semicolon"),
    pytest.param("test_a\nid.py", id="newline"),
    pytest.param("test_a$(id).py", id="substitution"),
])
def test_a_wildcard_matching_an_unsafe_file_name_is_refused(capsys, sglang_repo, permissions_file, name):
    (sglang_repo / "test/registered/spec" / name).write_text(
        'register_cuda_ci(est_time=5, stage="base-b", runner_config="1-gpu-large")\n')
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_a*.py")
    assert (code, result["plan"]["actions"]) == (2, [])
    assert "whose name holds characters a test command cannot carry" in result["reply"]
    assert "\nid.py" not in result["reply"]


def test_no_match_suggests_the_closest_names(capsys, sglang_repo, permissions_file):
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_eagle_smal.py")
    assert code == 2 and "Closest: test_eagle_small.py" in result["reply"]


@pytest.mark.parametrize("mutate, message", [
    pytest.param(lambda e: e["comment"].update(author_association=["MEMBER"]),
                 "comment.author_association is missing or not a str", id="association-list"),
    pytest.param(lambda e: e["comment"].update(id="99"), "comment.id is missing or not a int", id="id-text"),
    pytest.param(lambda e: e["issue"].update(user="alice"), "issue.user is missing or not a dict", id="pr-user-text"),
    pytest.param(lambda e: e["repository"].update(full_name=7), "repository.full_name is missing or not a str",
                 id="repo-number"),
])
def test_wrong_typed_event_fields_exit_2(capsys, tmp_path, permissions_file, mutate, message):
    event = issue_comment_event("/rerun-failed-ci")
    mutate(event)
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))
    code, out, err = chatops(capsys, "--event", str(path), "--permissions", str(permissions_file), "--dry-run")
    assert (code, out) == (2, "")
    assert message in err and "Traceback" not in err


def test_the_head_sha_given_is_what_the_rerun_pins(capsys, sglang_repo, permissions_file):
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_eagle_small.py",
                                         "--head-sha", "a" * 40)
    assert code == 0 and [a["inputs"]["sha"] for a in result["plan"]["actions"]] == ["a" * 40]


def test_cells_rerun_through_the_nightly_on_their_runners(capsys, sglang_repo, permissions_file):
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file,
                                         "/rerun-test cell:*-tp8-dp8-dpattn-* test_eagle_small.py")
    assert code == 0
    nightly = [a for a in result["plan"]["actions"] if a["workflow"] == "nightly.yml"]
    assert len(nightly) == 1 and nightly[0]["inputs"]["select"].split()
    assert all("-tp8-dp8-dpattn-" in cell for cell in nightly[0]["inputs"]["select"].split())
    assert "matrix cells on `" in result["reply"] and "dspark-ci run matrices/nightly.yaml --cell " in result["reply"]


def test_disaggregated_cells_rerun_on_the_runner_of_all_their_roles(capsys, sglang_repo, permissions_file):
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test cell:*-pd-p1tp8-d1tp8")
    assert code == 0
    [nightly] = [a for a in result["plan"]["actions"] if a["workflow"] == "nightly.yml"]
    assert nightly["inputs"]["select"] == "dsv4-flash-tp8-a2a-none-dspark-b7-cuda-pd-p1tp8-d1tp8"
    assert "`2x8-gpu-h200`" in result["reply"]
    assert "dspark-ci run matrices/pd.yaml --cell dsv4-flash-tp8-a2a-none-dspark-b7-cuda-pd-p1tp8-d1tp8" in result["reply"]


def test_an_unknown_cell_suggests_the_closest_ids(capsys, sglang_repo, permissions_file):
    code, result, _ = timed_chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test dsv4-flash-tp8-cuda")
    assert code == 2 and "no test file or matrix cell named dsv4-flash-tp8-cuda" in result["reply"]
    assert "Closest: dsv4-flash-tp8-" in result["reply"]


# --- what people paste: the bot's own line, pytest's node ids, a name without .py ---------------

@pytest.mark.parametrize("comment, expected", [
    pytest.param("/rerun-test cd test/ && python3 registered/spec/test_eagle_small.py",
                 {"1-gpu-h100": ["registered/spec/test_eagle_small.py"]}, id="the-bots-line"),
    pytest.param("/rerun-test cd test/ && python3 registered/spec/test_eagle_small.py TestEagle.test_gsm8k",
                 {"1-gpu-h100": ["registered/spec/test_eagle_small.py TestEagle.test_gsm8k"]},
                 id="the-bots-line-with-a-selector"),
    pytest.param("/rerun-test test_eagle_small.py::TestEagle::test_gsm8k",
                 {"1-gpu-h100": ["registered/spec/test_eagle_small.py TestEagle.test_gsm8k"]}, id="pytest-node-id"),
    pytest.param("/rerun-test test/registered/spec/test_eagle_small.py::TestEagle::test_gsm8k",
                 {"1-gpu-h100": ["registered/spec/test_eagle_small.py TestEagle.test_gsm8k"]},
                 id="pytest-node-id-with-path"),
])
def test_pasted_forms_are_understood(capsys, sglang_repo, permissions_file, comment, expected):
    code, result, err = chatops_json(capsys, sglang_repo, permissions_file, comment)
    assert (code, err) == (0, "")
    assert dispatched(result) == expected


def test_a_pasted_line_with_more_than_one_test_says_what_it_takes(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file,
                                   "/rerun-test cd test/ && python3 registered/a/test_a.py registered/b/test_b.py")
    assert code == 2 and "a pasted line runs one test" in result["reply"]
    assert "contains &" not in result["reply"]


def test_a_bad_pytest_selector_is_not_blamed_on_the_double_colon(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_x.py::A::b::c")
    assert code == 2 and "TestClass::test_method" in result["reply"] and "contains :" not in result["reply"]


def test_a_name_without_py_suggests_the_test_file(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, "/rerun-test test_eagle_small")
    assert code == 2 and result["plan"]["actions"] == []
    assert ("the test file test/registered/spec/test_eagle_small.py exists: /rerun-test test_eagle_small.py"
            in result["reply"])
