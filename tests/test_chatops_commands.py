"""A ChatOps command is one row (ci/chatops/handle.py COMMANDS: grammar, permission, handler): a row added there is
recognised, checked, parsed and run with nothing else touched, and what every command needs stays its own."""

from __future__ import annotations

from pathlib import Path

from dspark_ci.ci.chatops import handle as chatops
from dspark_ci.ci.chatops.event import event_from_flags
from dspark_ci.ci.chatops.grammar import no_arguments
from dspark_ci.ci.chatops.handle import ChatOpsCommand, ChatOpsConfig, OfflineContext, Outcome
from dspark_ci.ci.chatops.permissions import TAG_RUN_CI, UserPermissions
from dspark_ci.ground.errors import ExitCode


def _wave(command, event, config, context, plan) -> Outcome:
    plan["actions"] = [{"type": "add_label", "label": "waved", "says": "👋"}]
    return Outcome("👋\n", plan, ExitCode.OK, accepted=True)


def decide(comment: str, user: str = "alice", association: str = "MEMBER", users=None):
    event = event_from_flags(comment, user, association, None, 7, "sgl-project/sglang")
    config = ChatOpsConfig(repo_root=Path("."), users=users or {})
    return chatops.handle(event, config, OfflineContext(association))


def test_a_command_added_as_one_row_is_recognised_checked_parsed_and_run(monkeypatch):
    row = ChatOpsCommand("/wave", no_arguments, TAG_RUN_CI, _wave)
    monkeypatch.setattr(chatops, "COMMANDS", {**chatops.COMMANDS, row.name: row})
    allowed = {"alice": UserPermissions(can_tag_run_ci_label=True)}
    done = decide("/wave", users=allowed)
    assert done.exit_code == ExitCode.OK and done.reply.startswith("👋") and done.plan["command"] == "/wave"
    refused = decide("/wave", users={})  # its permission is the row's: the run-ci label right
    assert refused.exit_code == ExitCode.FELL_SHORT and "can_tag_run_ci_label" in refused.reply
    extra = decide("/wave now", users=allowed)  # its grammar is the row's: no arguments
    assert extra.exit_code == ExitCode.BAD_INPUT and "/wave takes no arguments" in extra.reply
    near = decide("/wavee", users=allowed)  # and the did-you-mean knows it
    assert "did you mean /wave?" in near.reply and "/bisect, /wave" in near.problem


def test_every_command_is_named_in_the_refusal_of_a_near_miss_in_table_order():
    near = decide("/rerun-tests test_x.py")
    assert "did you mean /rerun-test?" in near.reply
    assert near.problem.endswith("must be one of " + ", ".join(chatops.COMMANDS))
    assert list(chatops.COMMANDS) == ["/tag-run-ci-label", "/tag-and-rerun-ci", "/rerun-failed-ci", "/rerun-test",
                                      "/bisect"]
