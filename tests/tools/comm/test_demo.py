"""`rankwise comm demo`: every operation on real gloo ranks (2 and 3), natively and composed, and
checks that fail."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rankwise.tools.comm import ops
from tests.support.multiproc import run_ranks
from tests.support.tools.comm.patching import corrupting, replaced

COMPOSABLE = {
    "broadcast",
    "scatter",
    "scatter uneven",
    "gather",
    "gather uneven",
    "all_gather",
    "all_gather tensor",
    "reduce_scatter",
    "reduce_scatter tensor",
    "all_to_all",
    "all_to_all_single uneven",
    "barrier",
    *(f"reduce {op}" for op in ops.REDUCTIONS),
    *(f"all_reduce {op}" for op in ops.REDUCTIONS),
}


def _demo(
    composed: bool,
    names: list[str] | None = None,
    corrupt: str | None = None,
    lacking: str | None = None,
    lacking_error: type = RuntimeError,
):
    """One rank: run the demo; ``corrupt`` breaks that torch function's result on rank 1,
    ``lacking`` makes that torch function fail as a backend without it does."""
    from rankwise.process import destroy_process_group
    from rankwise.tools.comm import demo
    from rankwise.tools.harness import join

    def missing(original):
        def lacks(*args, **kwargs):
            raise lacking_error(f"ProcessGroupGloo does not support {lacking}")

        return lacks

    env, device = join(0, "gloo", 60)
    try:
        with replaced(corrupt, corrupting(rank=1, index=0)), replaced(lacking, missing):
            printed: list[str] = []
            ctx = ops.Ctx(env.rank, env.world_size, device, "gloo", composed=composed)
            results = demo.run_all(ctx, ops.select(names), emit=printed.append)
        return [(r.name, r.status, r.how) for r in results], printed
    finally:
        destroy_process_group()


@pytest.mark.multiproc
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("composed", [False, True], ids=["native", "composed"])
def test_every_operation_passes(world_size, composed):
    results = run_ranks(_demo, world_size, composed, timeout=90)
    statuses, printed = results[0]
    assert [name for name, _, _ in statuses] == [op.name for op in ops.OPS]
    assert {status for _, status, _ in statuses} == {"PASS"}, statuses
    ran_composed = {name for name, _, how in statuses if how != "native"}
    assert ran_composed == (COMPOSABLE if composed else set())
    assert results[1][1] == []  # only rank 0 prints
    # Each block lists every rank once, in order, right under the operation's line.
    for block in printed:
        ranks = [
            int(line.split()[1]) for line in block.splitlines() if line.lstrip().startswith("rank ")
        ]
        assert ranks == list(range(world_size)), block


@pytest.mark.multiproc
def test_uneven_parts_arrive_with_their_own_lengths():
    statuses, printed = run_ranks(
        _demo, 3, False, ["scatter", "gather", "all_to_all_single"], timeout=60
    )[0]
    scatter = next(block for block in printed if block.startswith("PASS  scatter uneven"))
    assert "rank 1   before (nothing)" in scatter and scatter.rstrip().endswith(
        "after [21, 22, 23]"
    )
    gather = next(block for block in printed if block.startswith("PASS  gather uneven"))
    assert "after [[1], [11, 12], [21, 22, 23]]" in gather


@pytest.mark.multiproc
def test_a_corrupted_result_fails_naming_the_rank():
    statuses, printed = run_ranks(
        _demo, 2, False, ["all_reduce", "broadcast"], "all_reduce", timeout=60
    )[0]
    status = {name: s for name, s, _ in statuses}
    assert status["all_reduce SUM"] == "FAIL" and status["broadcast"] == "PASS"
    block = next(b for b in printed if b.startswith("FAIL  all_reduce SUM"))
    wrong = [line for line in block.splitlines() if "<- wrong" in line]
    assert (
        len(wrong) == 1
        and wrong[0].lstrip().startswith("rank 1")
        and "expected [12, 14, 16, 18]" in wrong[0]
    )


@pytest.mark.multiproc
# NCCL raises ValueError for a ReduceOp it lacks
@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_an_operation_the_backend_lacks_runs_composed_and_says_so(error):
    statuses, printed = run_ranks(
        _demo, 2, False, ["reduce_scatter"], None, "reduce_scatter", error, timeout=60
    )[0]
    (name, status, how), single = statuses
    assert (name, status) == ("reduce_scatter", "PASS") and single[1] == "PASS"
    assert how.startswith("gloo lacks it (ProcessGroupGloo does not support reduce_scatter)")
    assert (
        "[gloo lacks it" in printed[0]
        and "composed: all_reduce, then each rank keeps its chunk]" in printed[0]
    )


@pytest.mark.multiproc
def test_the_command_runs_three_ranks_and_refuses_bad_input():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "comm",
            "demo",
            "--nproc-per-node",
            "3",
            "--op",
            "all_to_all",
            "--op",
            "barrier",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "3 ranks on gloo" in done.stdout and "2 of 2 operations passed" in done.stdout
    assert "PASS  barrier" in done.stdout and "rank 2   before arrived" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "rankwise.cli", "comm", "demo", "--op", "allreduce"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown operation 'allreduce'" in bad.stderr
    alone = subprocess.run(
        [sys.executable, "-m", "rankwise.cli", "comm", "demo", "--nproc-per-node", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert alone.returncode == 2 and "at least 2 ranks" in alone.stderr


@pytest.mark.multiproc
def test_a_rank_that_fails_is_named_without_a_traceback_of_ours():
    import os

    # a transport this torch build lacks: every rank fails
    env = {**os.environ, "GLOO_DEVICE_TRANSPORT": "UV"}
    done = subprocess.run(
        [sys.executable, "-m", "rankwise.cli", "comm", "demo", "--op", "barrier"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 1
    assert (
        "rankwise comm demo: worker(s) failed" in done.stderr
        and "unsupported gloo device" in done.stderr
    )
    assert "rankwise/cli/comm.py" not in done.stderr


def test_the_backend_is_nccl_only_where_cuda_and_nccl_are(monkeypatch):
    import torch
    import torch.distributed as torch_dist

    from rankwise.errors import ConfigError
    from rankwise.tools.harness import resolve_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_backend("auto") == "gloo"
    with pytest.raises(ConfigError, match="--backend nccl needs CUDA GPUs .* no CUDA device"):
        resolve_backend("nccl")
    # wiring only: a 1-GPU machine's answers
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch_dist, "is_nccl_available", lambda: True)
    assert resolve_backend("auto", 1) == "nccl" and resolve_backend("gloo", 1) == "gloo"
    assert resolve_backend("auto", 2) == "gloo"  # two ranks cannot share the one GPU under NCCL
    with pytest.raises(ConfigError, match="one GPU per rank: --nproc-per-node 2 on 1 GPU"):
        resolve_backend("nccl", 2)


@pytest.mark.multiproc
def test_one_failing_rank_ends_the_demo_promptly_naming_it():
    import os

    # Rank 1 fails after the first operation, before sending rank 0 its view of it: the failed
    # rank must not wait at a teardown barrier (that would hold both until --timeout).
    env = {**os.environ, "RANKWISE_TEST_FAULT": "raise:rank=1:step=1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "comm",
            "demo",
            "--op",
            "broadcast",
            "--op",
            "barrier",
            "--timeout",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert done.returncode == 1
    assert "rank 1" in done.stderr and "injected fault: rank 1 fails at step 1" in done.stderr
