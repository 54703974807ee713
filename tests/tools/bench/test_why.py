"""A bench row's cause and fix, read from its breakdown (unit)."""

from rankwise.measure.breakdown import PARTS
from rankwise.tools.bench.why import cells, detail, explain


def rank(
    r, step, late=0.0, last_in=0, loader="_SingleProcessDataLoaderIter", sync_ms=None, **parts
):
    values = {part: parts.get(part, 0.0) for part in PARTS}
    values["forward"] = parts.get(
        "forward", step - sum(v for k, v in values.items() if k != "forward")
    )
    return {
        "rank": r,
        "step_ms": step,
        "parts_ms": values,
        "late_ms": late,
        "sync_ms": sync_ms or {},
        "loader": loader,
        "steps": 5,
        "steps_kept": 5,
        "last_in": last_in,
    }


def test_a_rank_whose_loader_is_slow_is_named_with_its_loader_and_the_fix():
    why = explain(
        {"ranks": [rank(0, 40, straggler=30, forward=5), rank(1, 40, data=31, late=30, last_in=5)]}
    )
    assert why["part"] == "straggler" and why["rank"] == 0
    assert (
        "rank 1" in why["line"]
        and "data loader waits" in why["line"]
        and "num_workers=0" in why["line"]
    )
    assert "num_workers=2" in why["line"]


def test_a_late_rank_whose_forward_is_slow_is_named_as_the_straggler():
    why = explain(
        {
            "ranks": [
                rank(0, 40, straggler=30, forward=5),
                rank(1, 40, forward=35, late=30, last_in=5),
            ]
        }
    )
    assert "rank 1" in why["line"] and "its forward takes" in why["line"]


def test_a_rank_late_once_is_noise_not_a_straggler():
    why = explain({"ranks": [rank(0, 10, straggler=3), rank(1, 10, late=3, last_in=1)]})
    assert why["part"] is None and "no loss above the noise" in why["line"]


def test_tiny_ddp_buckets_are_named_with_ddps_default():
    facts = {"ddp": {"buckets": 8, "bucket_cap_mb": 0.01, "parameter_mb": 0.51, "comm_hook": None}}
    why = explain({"ranks": [rank(0, 20, comm=12), rank(1, 20, comm=11)], "facts": facts})
    assert (
        why["part"] == "comm"
        and "8 all-reduces a step" in why["line"]
        and "bucket_cap_mb=25" in why["line"]
    )


def test_one_fsdp_unit_is_told_to_wrap_per_layer():
    why = explain({"ranks": [rank(0, 20, comm=9), rank(1, 20, comm=9)], "facts": {"fsdp_units": 1}})
    assert "one FSDP unit" in why["line"] and "wrap each layer" in why["line"]


def test_host_syncs_name_their_lines():
    sites = {".item() at train.py:88": 4.0, "barrier at train.py:80": 1.0}
    why = explain(
        {"ranks": [rank(0, 20, sync=5, sync_ms=sites), rank(1, 20, sync=5, sync_ms=sites)]}
    )
    assert why["part"] == "sync" and ".item() at train.py:88: 4.0 ms" in why["line"]


def test_cells_show_each_loss_at_its_worst_rank_and_detail_every_rank():
    breakdown = {
        "ranks": [rank(0, 40, straggler=30, forward=5), rank(1, 40, data=31, late=30, last_in=5)],
        "steps": [6, 10],
        "window_step_ms": 38.0,
        "device": "cpu",
    }
    assert cells(breakdown)["straggler_ms"] == 30 and cells(breakdown)["data_ms"] == 31
    text = detail("torch x2", breakdown)
    assert "steps 6-10 profiled" in text and "rank 1" in text and "waiting for slowest rank" in text
    assert "why: rank 0 waits" in text
    assert explain(None) is None and cells(None) == {}


def test_one_ddp_bucket_for_the_whole_gradient_is_named():
    facts = {"ddp": {"buckets": 1, "bucket_cap_mb": 25.0, "parameter_mb": 6.56, "comm_hook": None}}
    why = explain({"ranks": [rank(0, 60, comm=19), rank(1, 60, comm=18)], "facts": facts})
    assert "one bucket" in why["line"] and "bucket_cap_mb=1" in why["line"]


def test_fsdp_units_are_counted_in_the_line():
    why = explain({"ranks": [rank(0, 20, comm=9), rank(1, 20, comm=9)], "facts": {"fsdp_units": 3}})
    assert "over its 3 units" in why["line"]
