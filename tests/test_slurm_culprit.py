"""The Slurm job's culprit when Slurm's SIGTERM reached a rank's wrapper after its server had already died of its own
error: at load 7 the peer that lost it exited first, srun ended the step, and the late wrapper's marker said "after
SIGTERM". Judged from exit markers alone, without a cluster (the cluster tests show the same on a real job)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from dspark_ci.launchers.contract import LaunchFailed, RankExit
from dspark_ci.launchers.slurm.lifecycle import _Job

OWN_ERROR = "RuntimeError: [sglang_sim fault rank_exit] node rank 1 exits after 3 s"
PEER_LOST = "RuntimeError: NCCL communicator was aborted: node rank 1 disconnected (sglang_sim: a peer rank exited)"


def job(tmp_path, signalled: set[int]) -> _Job:
    judged = object.__new__(_Job)  # only what judging reads: markers are given, no job was submitted
    judged.plan = SimpleNamespace(cell_id="c", ranks=(0, 1))
    judged.logs_dir, judged.job_id, judged._signalled = tmp_path, "14", set(signalled)
    return judged


def test_a_rank_that_died_of_its_own_error_before_the_signal_is_the_culprit(tmp_path):
    exits = [RankExit(0, 1, 100.0, [PEER_LOST]), RankExit(1, 1, 100.9, [OWN_ERROR])]  # rank 1's marker came late
    with pytest.raises(LaunchFailed) as caught:
        job(tmp_path, signalled={1})._judge(exits)
    assert (caught.value.node_rank, caught.value.sglang_error) == (1, OWN_ERROR)


def test_ranks_slurm_stopped_without_an_error_of_their_own_mean_the_job_was_ended_from_outside(tmp_path,
                                                                                                monkeypatch):
    ended = job(tmp_path, signalled={0, 1})
    monkeypatch.setattr(ended, "info", lambda max_age_s=0: {"JobState": "CANCELLED"}, raising=False)
    monkeypatch.setattr(ended, "spec", SimpleNamespace(secrets=()), raising=False)
    with pytest.raises(Exception) as caught:
        ended._judge([RankExit(0, 143, 100.0, ["SIGTERM received"]), RankExit(1, 143, 100.1, [PEER_LOST])])
    assert not isinstance(caught.value, LaunchFailed) and "without any rank failing on its own" in str(caught.value)
