"""What a user's clone must not carry: citations of a tracker it does not have ("issue NN": a comment says why
instead) and paths to a folder beside the checkout that no user has (the shared folder of the team)."""

from __future__ import annotations

import re

from tests.test_version_literal import REPO, tracked_files

ISSUE = re.compile(r"\bissues? \d+", re.IGNORECASE)  # "issue #N" is GitHub's own (chatops messages)
SHARED = re.compile(r"\.\./shared|/work/share[d]")  # [d]: the pattern does not match its own line


def lines_matching(pattern: re.Pattern) -> list[str]:
    found = []
    for name in tracked_files():
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        found += [f"{name}:{number}: {line.strip()[:100]}" for number, line in enumerate(text.splitlines(), 1)
                  if pattern.search(line)]
    return found


def test_no_tracker_issue_is_cited():
    assert lines_matching(ISSUE) == [], "say why instead of which issue"


def test_nothing_refers_to_a_folder_beside_the_checkout():
    assert lines_matching(SHARED) == []


def test_the_patterns_catch_what_they_are_for():
    cited = "issue" + " 22"  # spelt apart, so this file does not cite one itself
    assert ISSUE.search(f"made inconclusive ({cited})") and ISSUE.search(f"{cited.title()} and 27")
    assert not ISSUE.search("an issue_comment event") and not ISSUE.search("issue #4242 is not a pull request")
    assert SHARED.search("read .." + "/shared/CONTRACT.md")
