"""The run's compile report: each recompile's reason counted once across graphs, and its line."""

from __future__ import annotations

from rankwise.train import compiling


def test_a_reason_repeated_by_successive_graphs_is_one_reason():
    assert (
        compiling._without_frame("0/1: tensor 'x' size mismatch at index 1. expected 32, actual 24")
        == "tensor 'x' size mismatch at index 1. expected 32, actual 24"
    )
    assert compiling._without_frame("a reason: with a colon") == "a reason: with a colon"


def test_the_line_says_the_warm_up_the_compiles_and_each_recompile():
    summary = {
        "warmup_s": 41.27,
        "warmup_steps": 5,
        "compile": {
            "graphs": 3,
            "compile_s": 38.04,
            "recompiles": 2,
            "recompile_reasons": {"tensor 'x' size mismatch at index 1. expected 32, actual 24": 2},
            "dynamic_shapes": compiling.DYNAMIC_SHAPES,
        },
    }
    assert compiling.line(summary) == (
        "compile: warm-up 41.3 s over the first 5 step(s), left out of the steady throughput; "
        "Dynamo compiled 3 graph(s) in 38.0 s, 2 recompile(s) (2 x tensor 'x' size mismatch at "
        "index 1. expected 32, actual 24); shapes: automatic dynamic (torch's default)"
    )
    assert compiling.line({"warmup_s": 1.0}) is None  # an eager run
