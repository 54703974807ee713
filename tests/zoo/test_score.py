"""Scoring a command against its manifest: a verdict, the kinds named, missed and false; kinds
from verify.json's own fields where it writes them, else from its texts."""

from __future__ import annotations

import json

from tests.support.zoo import runner

score = runner("score")
EXPECT = {
    "verdict": "not equivalent",
    "defects": ["replicas", "batch-dependent"],
    "allowed": ["gradient"],
}


def test_a_right_verdict_with_every_defect_and_an_allowed_kind_is_ok():
    said = {
        "verdict": "not equivalent",
        "framework": "torch",
        "kinds": ["batch-dependent", "gradient", "replicas"],
    }
    assert score.score("verify", 1, said, EXPECT, "torch")["outcome"] == "ok"


def test_a_missed_defect_a_false_one_or_another_framework_is_wrong():
    said = {
        "verdict": "not equivalent",
        "framework": "spawn",
        "kinds": ["batch-dependent", "samples"],
    }
    result = score.score("verify", 1, said, EXPECT, "torch")
    assert (result["outcome"], result["missed"], result["false"]) == (
        "wrong",
        ["replicas"],
        ["samples"],
    )
    assert result["framework_right"] is False


def test_a_run_that_could_not_run_or_timed_out_is_no_verdict():
    assert (
        score.score("verify", 4, {"verdict": "could not run"}, EXPECT, "torch")["outcome"]
        == "crash"
    )
    assert score.score("verify", 124, {}, EXPECT, "torch")["outcome"] == "timeout"
    assert score.score("plan", 2, {}, EXPECT, "torch")["outcome"] == "crash"


def test_kinds_come_from_verify_json_s_own_fields_where_it_writes_them(tmp_path):
    report = {
        "verdict": "vacuous",
        "framework": {"name": "torch"},
        "diagnosis": ["BatchNorm2d"],
        "causes": [{"kind": "samples", "text": "x"}],
        "findings": [{"kind": "epochs", "text": "y"}],
    }
    (tmp_path / "verify.json").write_text(json.dumps(report))
    said = score.verify_said(tmp_path)
    assert (said["kinds"], said["named_by"], said["framework"]) == (
        ["epochs", "samples"],
        "kind",
        "torch",
    )


def test_without_kinds_the_texts_are_read_and_a_negation_is_not_a_cause(tmp_path):
    diagnosis = (
        "the samples were the same, no layer depends on the batch: not a mean over the global batch"
    )
    finding = "the training loader's DistributedSampler shuffles, but set_epoch was never called"
    report = {
        "verdict": "not equivalent",
        "diagnosis": [diagnosis],
        "findings": [{"level": "error", "text": finding}],
    }
    (tmp_path / "verify.json").write_text(json.dumps(report))
    said = score.verify_said(tmp_path)
    assert (said["kinds"], said["named_by"]) == (["epochs", "loss-mean"], "text")


def test_bench_is_wrong_where_its_exit_code_states_another_verdict_than_verify_s():
    verify = {"name": "verify", "exit": 1, "verdict": "not equivalent", "kinds": ["replicas"]}
    bench = {"name": "bench", "exit": 0, "verdict": "not equivalent", "kinds": []}
    score.judge(verify, EXPECT, "torch", None)
    assert verify["outcome"] == "wrong" and verify["missed"] == ["batch-dependent"]
    # one reason per row: bench is not held to every defect, but to verify's exit code
    assert score.judge(bench, EXPECT, "torch", verify)["disagrees"] == "exit 0, verify's 1"
    assert score.judge(dict(bench, exit=1), EXPECT, "torch", verify)["outcome"] == "ok"


def test_a_text_names_one_kind_the_most_specific():
    hook = "gradients exchanged through a hook: the gradient the optimizer received differs"
    rate = "the optimizer's learning rate differs at step 2: a change of the hyper-parameters"
    assert score.kinds_in([hook, rate]) == ["comm-hook", "learning-rate"]


def test_verify_is_judged_on_the_verdict_its_exit_code_states_and_warnings_never_count_false():
    """Equivalent steps with a finding that fails the script (exit 1) are "not equivalent", as
    bench's row says; a sync point or an unseeded initialisation is named, not a false cause."""
    said = {
        "verdict": "equivalent",
        "framework": "torch",
        "kinds": ["batch-dependent", "replicas", "sync-point", "start-differs"],
    }
    result = score.score("verify", 1, said, EXPECT, "torch")
    assert (result["outcome"], result["false"]) == ("ok", [])
    assert score.score("verify", 0, said, EXPECT, "torch")["verdict_right"] is False


def test_bench_on_a_vacuous_comparison_of_a_defective_script_says_what_verify_exits():
    """The DDP tutorials: every process draws its own data (samples), so the compared steps are
    vacuous, and verify exits 1 for the finding; bench's row states that exit code's verdict."""
    vacuous = {"verdict": "vacuous", "defects": ["samples"]}
    said = {"verdict": "not equivalent", "kinds": ["samples"]}
    assert score.score("bench", 1, said, vacuous, "spawn")["outcome"] == "ok"
    verified = score.score("verify", 1, dict(said, verdict="vacuous"), vacuous, "spawn")
    assert verified["outcome"] == "ok"
    assert score.score("bench", 5, dict(said, verdict="vacuous"), vacuous, "spawn")["outcome"] == (
        "wrong"
    )


def test_bench_refusing_a_script_no_timed_run_can_measure_is_right_where_the_manifest_says_so():
    refused = dict(EXPECT, bench="could not run", bench_why="one step in all")
    assert (
        score.score("bench", 4, {"verdict": "could not run"}, refused, "torch")["outcome"] == "ok"
    )
    assert score.score("bench", 1, {"verdict": "not equivalent"}, refused, "torch")["outcome"] == (
        "wrong"
    )
    assert score.score("bench", 4, {"verdict": "could not run"}, EXPECT, "torch")["outcome"] == (
        "crash"
    )
    # (its exit code is not held to verify's: no timed run of it has a verdict)
    verify = {"name": "verify", "exit": 3, "verdict": "not comparable", "kinds": []}
    bench = {"name": "bench", "exit": 4, "verdict": "could not run", "kinds": []}
    refused_nothing = dict(refused, verdict="not comparable", defects=[])
    score.judge(verify, refused_nothing, "torch", None)
    assert score.judge(bench, refused_nothing, "torch", verify)["outcome"] == "ok"
