"""A ChatOps decision as a file: what the job that reads the PR decided, for the job that writes to GitHub.

The ChatOps workflow is two jobs. **decide** has the PR's tree on disk and a read-only token: it runs
``handle`` and writes the ``Outcome`` here (``--decision-out``). **act** never sees PR files and holds the
write permissions: it reads the decision back (``--carry-out``) and runs ``execute``. A decision is checked
before anything is written: it must be about this event, and every action must be one ChatOps plans, with
inputs of the shapes ChatOps produces, so even a decide job subverted through the PR's files could not make
act dispatch another workflow, label anything else, run a path the rerun would not accept or ask for a runner
outside the fleet.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dspark_ci.ci.chatops.event import CommentEvent
from dspark_ci.ci.chatops.grammar import MAX_TRIALS
from dspark_ci.ci.chatops.handle import (
    BISECT_WORKFLOW,
    NIGHTLY_WORKFLOW,
    RERUN_WORKFLOW,
    RUN_CI_LABEL,
    Outcome,
    request_id,
)
from dspark_ci.ci.chatops.resolve_test_paths import SAFE_PATH
from dspark_ci.ground.errors import BadInput, ExitCode

SCHEMA = 1
MAX_REPLY_CHARS = 65_000  # GitHub's limit for a comment is 65,536
_SHA = re.compile(r"(?:[0-9a-f]{40})?")
_SELECT = re.compile(r"[A-Za-z0-9._*?-]+(?: [A-Za-z0-9._*?-]+)*")
_MARKER = re.compile(r"<!--rrt:\d+-->")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a runner label, cell id, metric or build
FIX = "pass the decision file the decide job of this same comment wrote (dspark-ci chatops --decision-out)"


def write_decision(path: Path, outcome: Outcome) -> None:
    path.write_text(json.dumps({
        "schema": SCHEMA, "reply": outcome.reply, "plan": outcome.plan, "exit_code": int(outcome.exit_code),
        "problem": outcome.problem, "accepted": outcome.accepted}, indent=2, ensure_ascii=False), encoding="utf-8")


def read_decision(path: Path, event: CommentEvent, fleet: frozenset[str]) -> Outcome:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BadInput(str(path), f"cannot read the decision ({err})", FIX) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BadInput(str(path), f"not a ChatOps decision (schema {SCHEMA})", FIX)
    reply, plan, problem = data.get("reply"), data.get("plan"), data.get("problem")
    if not isinstance(reply, str) or len(reply) > MAX_REPLY_CHARS or not isinstance(plan, dict) \
            or not (problem is None or isinstance(problem, str)) or not isinstance(data.get("accepted"), bool):
        raise BadInput(str(path), "reply, plan, problem or accepted is missing or of the wrong type", FIX)
    code = data.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool) or code not in {int(c) for c in ExitCode}:
        raise BadInput(str(path), f"exit_code {code!r} is not one of ours", FIX)
    exit_code = ExitCode(code)
    about = {"user": event.user, "repo": event.repo, "pr": event.pr_number}
    if event.comment_id is not None:
        about["request"] = request_id(event)
    wrong = [key for key, value in about.items() if plan.get(key) != value]
    if wrong:
        raise BadInput(str(path), f"the decision is about another comment ({', '.join(wrong)} differ)", FIX)
    actions = plan.get("actions")
    if not isinstance(actions, list) or not all(isinstance(a, dict) and _allowed(a, reply, fleet) for a in actions):
        raise BadInput(str(path), "holds an action ChatOps never plans", FIX)
    return Outcome(reply, plan, exit_code, problem, data["accepted"])


def _allowed(action: dict, reply: str, fleet: frozenset[str]) -> bool:
    kind = action.get("type")
    if kind in ("add_label", "rerun_failed_runs"):
        return action.get("label", RUN_CI_LABEL) == RUN_CI_LABEL and isinstance(action.get("says"), str) \
            and action["says"] in reply
    if kind != "workflow_dispatch" or not isinstance(action.get("ref"), str):
        return False
    inputs = action.get("inputs")
    if not isinstance(inputs, dict) or not all(isinstance(v, str) for v in inputs.values()):
        return False
    if action.get("workflow") == NIGHTLY_WORKFLOW:
        return set(inputs) - {"trials"} == {"select", "reply_comment_id", "reply_marker", "request"} \
            and bool(_SELECT.fullmatch(inputs["select"])) and bool(_MARKER.fullmatch(inputs["reply_marker"])) \
            and _trials_ok(inputs.get("trials", ""))
    if action.get("workflow") == BISECT_WORKFLOW:
        return (set(inputs) == {"runner", "matrix", "cell", "metric", "good", "bad", "pr", "sha", "reply_comment_id",
                                "reply_marker", "request"}
                and all(_WORD.fullmatch(inputs[key]) for key in ("runner", "cell", "metric", "good", "bad"))
                and SAFE_PATH.fullmatch(inputs["matrix"]) is not None and bool(_SHA.fullmatch(inputs["sha"]))
                and bool(_MARKER.fullmatch(inputs["reply_marker"])))
    if action.get("workflow") != RERUN_WORKFLOW:
        return False
    return (set(inputs) == {"runner", "backend", "tests", "pr", "sha", "reply_comment_id", "reply_marker", "request"}
            and inputs["runner"] in fleet and bool(_SHA.fullmatch(inputs["sha"]))
            and bool(_MARKER.fullmatch(inputs["reply_marker"])) and _safe_tests(inputs["tests"]))


def _trials_ok(text: str) -> bool:
    """/rerun-test --trials: absent, or 2..MAX_TRIALS."""
    return text == "" or (text.isdigit() and 2 <= int(text) <= MAX_TRIALS)


def _safe_tests(text: str) -> bool:
    try:
        argvs = json.loads(text)
    except ValueError:
        return False
    return isinstance(argvs, list) and all(
        isinstance(argv, list) and argv and all(isinstance(a, str) and SAFE_PATH.fullmatch(a) for a in argv)
        for argv in argvs)
