"""The heart of correctness: N ranks with global batch B compute what one process with batch B
computes.

DistributedSampler's seeded permutation, rank r taking every W-th index, makes the
ranks' shards of step t together exactly batch t of the single-process run.  With fp32
and dropout off, parameters must agree to 1e-5 after several optimizer steps.
"""

import pytest

from rankwise.data.prepare import PreparedData
from rankwise.measure.tolerance import COMM_HOOK, max_param_diff
from rankwise.train.config import build_config
from tests.support.multiproc import run_ranks
from tests.support.strategies import (
    CASE_DEFAULTS,
    CASES,
    case_weights,
    strategies_for,
    train_case,
)

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def single_run(datasets, tmp_path_factory):
    """The one-process reference runs, trained once per (data, model, batch) and shared by every
    strategy."""
    cache = {}

    def run(case: str, batch: int, extra: tuple[str, ...] = ()) -> dict:
        if (case, batch, extra) not in cache:
            data, model = CASES[case]
            out = tmp_path_factory.mktemp(f"single-{case}-{batch}")
            steps = run_ranks(
                train_case,
                1,
                str(out),
                str(datasets / data),
                [*model, f"batch_size={batch}", "strategy=single", *extra],
            )
            assert steps == [(6, 1)]
            cache[case, batch, extra] = case_weights(out)
        return cache[case, batch, extra]

    return run


# Every registered multi-process strategy (tests/support/strategies.py: COVERAGE).  DeepSpeed's
# default is ZeRO-2; ZeRO-3 also shards (and here updates in place) the parameters.
STRATEGIES = strategies_for("equivalence")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_match_single_process(strategy, case, datasets, single_run, tmp_path):
    data, model = CASES[case]
    results = run_ranks(
        train_case,
        2,
        str(tmp_path / strategy),
        str(datasets / data),
        [*model, "batch_size=16", f"strategy={strategy}"],
    )
    # Accelerate's num_processes, DeepSpeed's world size, ...: no rank trained alone.
    assert results == [(6, 2), (6, 2)]
    single, distributed = single_run(case, 16), case_weights(tmp_path / strategy)
    print(f"{case}: max |single - {strategy}| = {max_param_diff(single, distributed):.2e}")
    assert max_param_diff(single, distributed) < TOLERANCE
    # The runs really trained: weights moved well beyond the tolerance from their initial values.
    initial = _initial_weights(data, model, datasets)
    assert max_param_diff(single, initial) > 100 * TOLERANCE


@pytest.mark.parametrize("hook", list(COMM_HOOK))
def test_ddp_comm_hooks_train_within_their_stated_tolerance(hook, datasets, single_run, tmp_path):
    data, model = CASES["tiny-bert"]
    # PowerSGD compresses from step 2 of 6
    options = [f"ddp.comm_hook={hook}", "ddp.powersgd_start_step=2"]
    assert run_ranks(
        train_case,
        2,
        str(tmp_path),
        str(datasets / data),
        [*model, "batch_size=16", "strategy=ddp", *options],
    ) == [(6, 2), (6, 2)]
    difference = max_param_diff(single_run("tiny-bert", 16), case_weights(tmp_path))
    print(
        f"ddp.comm_hook={hook}: max |single - ddp| = {difference:.2e} (stated {COMM_HOOK[hook]:g})"
    )
    assert difference < COMM_HOOK[hook]
    # the hook really changed what was sent: not the exact fp32 average
    assert difference > TOLERANCE


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gradient_accumulation_matches_the_full_batch(strategy, datasets, single_run, tmp_path):
    _, model = CASES["toy-mlp"]
    run_ranks(
        train_case,
        2,
        str(tmp_path / "accum"),
        str(datasets / "toy"),
        [*model, "batch_size=32", "grad_accum=2", f"strategy={strategy}"],
    )
    assert max_param_diff(single_run("toy-mlp", 32), case_weights(tmp_path / "accum")) < TOLERANCE


@pytest.mark.parametrize("stage", [0, 1])
def test_deepspeed_zero_stages_0_and_1_match_single_process(stage, datasets, single_run, tmp_path):
    """Stages 2 and 3 run in every test above; 0 (plain data parallel) and 1 (sharded optimizer
    state) here."""
    _, model = CASES["toy-mlp"]
    results = run_ranks(
        train_case,
        2,
        str(tmp_path / "zero"),
        str(datasets / "toy"),
        [*model, "batch_size=16", f"strategy=deepspeed-zero{stage}"],
    )
    assert results == [(6, 2), (6, 2)]
    assert max_param_diff(single_run("toy-mlp", 16), case_weights(tmp_path / "zero")) < TOLERANCE


# A norm limit far below the toy MLP's gradient norms, so every step is clipped.  AdamW divides
# by the gradient's running RMS, so a uniform rescaling changes its update only through eps
# (1e-6): the limit is low enough that the clipped per-parameter gradients are comparable to eps.
TIGHT_CLIPPING = ["optim.max_grad_norm=1e-4"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gradient_clipping_matches_single_process(strategy, datasets, single_run, tmp_path):
    """Each library clips the norm of the *global* gradient (all ranks' shards together), as one
    process does."""
    _, model = CASES["toy-mlp"]
    overrides = [*model, "batch_size=16", *TIGHT_CLIPPING]
    single = single_run("toy-mlp", 16, extra=tuple(TIGHT_CLIPPING))
    run_ranks(
        train_case,
        2,
        str(tmp_path / "clip"),
        str(datasets / "toy"),
        [*overrides, f"strategy={strategy}"],
    )
    assert max_param_diff(single, case_weights(tmp_path / "clip")) < TOLERANCE
    # Guards the test: the tight limit changed the single run (clipping fired).
    assert max_param_diff(single, single_run("toy-mlp", 16)) > 100 * TOLERANCE


def test_a_different_global_batch_does_not_match(single_run):
    """Guards the test itself: the comparison is sensitive enough to see a wrong batch."""
    assert max_param_diff(single_run("toy-mlp", 16), single_run("toy-mlp", 32)) > 100 * TOLERANCE


def _initial_weights(data: str, model_overrides: list[str], datasets) -> dict:
    from rankwise.models import build_model
    from rankwise.runtime import seed_everything

    prepared = PreparedData.load(datasets / data)
    cfg = build_config(overrides=["seed=7", "model.dropout=0.0", *model_overrides])
    seed_everything(cfg.seed)
    model, _ = build_model(
        cfg.model.name,
        num_labels=prepared.num_labels,
        dropout=0.0,
        vocab_size=prepared.encoder.vocab_size if prepared.encoder else None,
        pad_id=prepared.encoder.pad_id if prepared.encoder else 0,
        max_length=cfg.data.max_length,
        features=prepared.features,
        ngrams=prepared.ngrams.to_dict() if prepared.ngrams else None,
    )
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_model_split_across_two_devices_inside_ddp(single_run, datasets, tmp_path):
    """The source documents' ToyMpModel: each rank's MLP halves on two devices, DDP without
    device_ids. On a CPU both halves sit on the CPU; the run must equal the unsplit single-process
    one."""
    _, model = CASES["toy-mlp"]
    run_ranks(
        train_case,
        2,
        str(tmp_path / "split"),
        str(datasets / "toy"),
        [*model, "batch_size=16", "strategy=ddp", "model.split_devices=true"],
    )
    assert max_param_diff(single_run("toy-mlp", 16), case_weights(tmp_path / "split")) < TOLERANCE


def _train_compiled(run_dir: str, data_dir: str, overrides: list[str]) -> tuple[int, int, dict]:
    """``train_case`` compiled: (steps, world size, the summary's compile section)."""
    from rankwise.train.loop import run_training

    cfg = build_config(overrides=[*CASE_DEFAULTS, *overrides, "compile=true"])
    summary = run_training(cfg, PreparedData.load(data_dir), run_dir)
    compiled = {**summary["compile"], "warmup_s": summary["warmup_s"]}
    return summary["steps"], summary["library_world_size"], compiled


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_compiled_ranks_match_the_eager_single_process(strategy, datasets, single_run, tmp_path):
    data, model = CASES["toy-mlp"]
    results = run_ranks(
        _train_compiled,
        2,
        str(tmp_path),
        str(datasets / data),
        [*model, "batch_size=16", f"strategy={strategy}"],
    )
    assert [(steps, world) for steps, world, _ in results] == [(6, 2)] * 2
    # Dynamo really compiled, in every rank, and the summary says what it cost and why it
    # recompiled (each reason a failed guard; the shape choice stated)
    for _, _, compiled in results:
        assert compiled["graphs"] >= 1 and 0 < compiled["compile_s"], compiled
        assert compiled["recompiles"] == sum(compiled["recompile_reasons"].values()), compiled
        assert "automatic dynamic shapes" in compiled["dynamic_shapes"]
        assert compiled["warmup_s"] > 0
    difference = max_param_diff(single_run("toy-mlp", 16), case_weights(tmp_path))
    print(f"toy-mlp: max |single (eager) - {strategy} (compiled)| = {difference:.2e}")
    assert difference < TOLERANCE


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed-zero3"])
def test_activation_checkpointing_matches_the_single_process_without_it(
    strategy, datasets, single_run, tmp_path
):
    data, model = CASES["tiny-bert"]
    assert (
        run_ranks(
            train_case,
            2,
            str(tmp_path),
            str(datasets / data),
            [
                *model,
                "batch_size=16",
                f"strategy={strategy}",
                "model.activation_checkpointing=true",
            ],
        )
        == [(6, 2)] * 2
    )
    difference = max_param_diff(single_run("tiny-bert", 16), case_weights(tmp_path))
    print(f"tiny-bert: max |single - {strategy} with activation checkpointing| = {difference:.2e}")
    assert difference < TOLERANCE
