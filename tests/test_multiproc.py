"""The multi-process test helper itself: pooled ranks are reused cleanly; a failing rank is
named."""

import os

import pytest

from tests.support.multiproc import RanksFailed, run_ranks

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)


def _pid_env_and_sum() -> tuple[int, str | None, float]:
    import torch

    import rankwise

    leaked = os.environ.get("LEAKED_BY_AN_EARLIER_CALL")
    os.environ["LEAKED_BY_AN_EARLIER_CALL"] = "1"
    with rankwise.setup("ddp") as rt:
        total = rt.all_reduce(torch.ones(1), "sum").item()
    return os.getpid(), leaked, total


def _rank_one_fails_while_rank_zero_waits() -> None:
    import torch

    import rankwise

    with rankwise.setup("ddp") as rt:
        if rt.rank == 1:
            raise ValueError("boom on rank 1")
        rt.all_reduce(torch.ones(1), "sum")  # rank 1 never joins this one


def test_pooled_ranks_are_reused_with_a_clean_environment():
    first = run_ranks(_pid_env_and_sum, 2)
    second = run_ranks(_pid_env_and_sum, 2)
    # both ranks joined a new group each time
    assert [total for _, _, total in first + second] == [2.0] * 4
    # the same processes served both calls
    assert [pid for pid, _, _ in first] == [pid for pid, _, _ in second]
    # each call starts from the rank's own environment
    assert [leaked for _, leaked, _ in second] == [None, None]


def test_a_failing_rank_is_named_with_its_traceback():
    with pytest.raises(RanksFailed, match=r"(?s)--- rank 1 ---.*ValueError: boom on rank 1"):
        run_ranks(_rank_one_fails_while_rank_zero_waits, 2, timeout=120)
