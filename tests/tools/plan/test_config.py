"""The plan's strategies come from the facts each strategy file declares, not from lists here."""

from rankwise.tools.plan.config import known, planned, upgrades


def test_the_planned_known_and_upgrade_sets_are_derived_from_what_each_strategy_shards():
    assert planned() == [
        "single",
        "ddp",
        "deepspeed-zero1",
        "deepspeed-zero2",
        "deepspeed-zero3",
        "fsdp",
    ]
    # Accelerate and Horovod are planned when named; dp and ZeRO-0 have no plan model
    assert set(known()) - set(planned()) == {"accelerate", "ddp-spawn", "horovod"}
    assert set(upgrades("ddp")) == {"deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3", "fsdp"}
    assert set(upgrades("deepspeed-zero1")) == {"deepspeed-zero2", "deepspeed-zero3", "fsdp"}
    assert set(upgrades("deepspeed-zero2")) == {"deepspeed-zero3", "fsdp"}
    assert upgrades("fsdp") == upgrades("deepspeed-zero3") == []
    assert set(upgrades("horovod")) == set(upgrades("accelerate")) == set(upgrades("ddp"))
