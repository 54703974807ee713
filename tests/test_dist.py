import pytest
import torch

import rankwise
from rankwise import dist
from tests.support.multiproc import RanksFailed, run_ranks


def test_collectives_are_noops_in_one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    t = torch.tensor([1.0, 2.0])
    assert dist.all_reduce(t, "mean") is t and t.tolist() == [1.0, 2.0]
    assert torch.equal(dist.all_gather(t), t)
    dist.barrier()
    index, values = dist.gather_exact(torch.tensor([1, 0]), torch.tensor([10, 20]), total=2)
    assert index.tolist() == [0, 1] and values.tolist() == [20, 10]


@pytest.mark.parametrize(
    "collective",
    [
        lambda: dist.all_reduce(torch.ones(1)),
        lambda: dist.all_gather(torch.ones(1)),
        lambda: dist.broadcast(torch.ones(1)),
        dist.barrier,
        lambda: dist.broadcast_object(1),
        lambda: dist.gather_exact(torch.arange(2), total=2),
    ],
    ids=["all_reduce", "all_gather", "broadcast", "barrier", "broadcast_object", "gather_exact"],
)
def test_missing_process_group_is_loud(monkeypatch, collective):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(dist.MissingProcessGroupError, match="WORLD_SIZE=2.*RANK=1.*has not joined"):
        collective()


def _collectives():
    import rankwise

    with rankwise.setup("ddp") as rt:
        r = rt.rank
        total = rt.all_reduce(torch.tensor([float(r + 1)]), "sum").item()
        mean = rt.all_reduce(torch.tensor([float(r + 1)]), "mean").item()
        biggest = rt.all_reduce(torch.tensor([float(r)]), "max").item()
        # Uneven first dimensions: rank r contributes r+1 rows.
        gathered = rt.all_gather(torch.full((r + 1, 2), r)).tolist()
        shared = rt.broadcast_object({"from": r}, src=0)
        from_last = rt.broadcast(torch.tensor([float(r)]), src=rt.world_size - 1).item()
        return total, mean, biggest, gathered, shared, from_last


@pytest.mark.multiproc
@pytest.mark.parametrize("world_size", [2, 3])
def test_collectives_across_ranks(world_size):
    results = run_ranks(_collectives, world_size)
    expected_rows = [[r, r] for r in range(world_size) for _ in range(r + 1)]
    for total, mean, biggest, gathered, shared, from_last in results:
        assert total == sum(range(1, world_size + 1))
        assert mean == pytest.approx(total / world_size)
        assert biggest == world_size - 1
        assert gathered == expected_rows
        assert shared == {"from": 0}
        assert from_last == world_size - 1


def _fail_inside_setup():
    import torch.distributed as torch_dist

    import rankwise

    try:
        with rankwise.setup("ddp") as rt:
            joined = torch_dist.is_initialized()
            raise ValueError(f"rank {rt.rank} fails mid-run")
    except ValueError as e:
        return joined, torch_dist.is_initialized(), str(e)


@pytest.mark.multiproc
def test_teardown_runs_when_the_loop_raises():
    for rank, (joined, still_joined, message) in enumerate(run_ranks(_fail_inside_setup, 2)):
        assert joined and not still_joined  # the group was left although the body raised
        assert message == f"rank {rank} fails mid-run"


def _mismatched_shapes() -> None:
    import os

    # what launch.check_collectives sets for the workers
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    with rankwise.setup("ddp") as rt:
        rt.all_reduce(torch.ones(3 + rt.rank), "sum")


@pytest.mark.multiproc
def test_checked_collectives_name_a_shape_mismatch_instead_of_hanging():
    with pytest.raises(
        RanksFailed,
        match=r"Detected mismatch between collectives on ranks.*TensorShape=\[3\].*"
        r"but Rank 1 is running collective.*TensorShape=\[4\]",
    ):
        run_ranks(_mismatched_shapes, 2, timeout=60, fresh=True)
