"""Each strategy recognises its own checkpoint format (``claims``) and reads it back whole by
parameter name; resuming finds the format's owner through the registry alone (``format_owner``)."""

import pytest
import torch
from torch import nn

from rankwise.checkpoint import WEIGHTS, CheckpointError, write_weights
from rankwise.process import ProcessEnv
from rankwise.strategies import format_owner, get_strategy
from rankwise.strategies.base import OPTIMIZER_FILE, Strategy


def test_each_format_is_claimed_by_its_strategy_and_found_from_the_directory(tmp_path):
    whole, shards, partitions, bare = (
        tmp_path / name for name in ("whole", "shards", "partitions", "bare")
    )
    for directory in (whole, shards, partitions, bare):
        directory.mkdir()
    (whole / OPTIMIZER_FILE).write_bytes(b"")
    (shards / "sharded").mkdir()
    (partitions / "deepspeed" / "state").mkdir(parents=True)
    ddp, fsdp, deepspeed = (get_strategy(name) for name in ("ddp", "fsdp", "deepspeed"))
    assert (ddp.claims(whole), fsdp.claims(whole), deepspeed.claims(whole)) == (True, False, False)
    assert (ddp.claims(shards), fsdp.claims(shards), deepspeed.claims(shards)) == (
        False,
        True,
        False,
    )
    assert (ddp.claims(partitions), fsdp.claims(partitions), deepspeed.claims(partitions)) == (
        False,
        False,
        True,
    )
    assert format_owner(whole, "ddp") is ddp and format_owner(whole, "accelerate") is get_strategy(
        "accelerate"
    )
    # The directory decides, whatever name the writer recorded: a renamed or unknown writer still
    # resumes.
    assert format_owner(shards, "ddp") is fsdp and format_owner(partitions, "gone") is deepspeed
    assert (
        format_owner(shards, "deepspeed-zero3") is fsdp
        and format_owner(partitions, "deepspeed-zero3") is deepspeed
    )
    assert format_owner(bare, "ddp") is ddp  # saved without an optimizer: its writer's
    with pytest.raises(
        CheckpointError, match="written by strategy 'gone', which this installation does not know"
    ):
        format_owner(bare, "gone")


def test_the_whole_state_format_reads_back_by_parameter_name(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(
        [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.5}]
    )
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    single = get_strategy("single")(ProcessEnv.detect())
    single.save_state(tmp_path, model, optimizer)
    write_weights(model.state_dict(), tmp_path / WEIGHTS)

    names = single.optimizer_names(model, optimizer)
    weights, optim = single.read_whole_state(tmp_path, model, names)
    assert names == [["0.weight", "0.bias"], ["2.weight", "2.bias"]]
    assert torch.equal(weights["2.bias"], model[2].bias.detach())
    assert torch.equal(
        optim["state"]["2.weight"]["exp_avg"], optimizer.state[model[2].weight]["exp_avg"]
    )
    assert (
        optim["param_groups"][1]["params"] == ["2.weight", "2.bias"]
        and optim["param_groups"][1]["lr"] == 0.5
    )
    # no optimizer: the weights alone
    assert single.read_whole_state(tmp_path, model, None)[1] is None

    (tmp_path / OPTIMIZER_FILE).unlink()
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        Strategy.read_whole_state.__func__(get_strategy("ddp"), tmp_path, model, names)
