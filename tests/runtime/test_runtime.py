"""The public API behaves the same under every strategy (a user's loop:
``tests/support/public_loop.py``).

For each strategy: accumulation 2, clipping that fires every step, a checkpoint after
step 3 written with ``rt.save_state``; a fresh process group loads it with
``rt.load_state`` and finishes.  The resumed run must end with bitwise the weights of
the uninterrupted one, both must match one process within tolerance, and
``rt.step(..., max_norm=...)`` must report the single process's global gradient norm.
"""

from __future__ import annotations

import pytest
import torch

import rankwise
from rankwise.errors import ConfigError
from rankwise.measure.tolerance import max_param_diff
from rankwise.strategies import lookup
from tests.support import public_loop
from tests.support.multiproc import run_ranks
from tests.support.strategies import strategies_for
from tests.support.tiers import starts_processes

TOLERANCE = 1e-5
"""fp32, same global batch: summation order is all that differs (measured below 1e-7)."""

# Test id -> (strategy name, ranks): every registered strategy (tests/support/strategies.py:
# COVERAGE), a one-process one on 1 rank.  Horovod runs under horovodrun, in
# test_horovod_public_loop.
STRATEGIES = {
    name: (name, 2 if lookup(name).cls.multiprocess else 1)
    for name in strategies_for("public loop")
}


def _phases(strategy: str, ranks: int, tmp_path) -> dict[str, dict]:
    run = lambda out, phase: run_ranks(public_loop.train, ranks, strategy, str(out), phase)[0]  # noqa: E731
    return {
        "full": run(tmp_path / "full", "full"),
        "first": run(tmp_path / "cut", "first"),
        "resume": run(tmp_path / "cut", "resume"),
    }


@pytest.fixture(scope="module")
@starts_processes()
def single(tmp_path_factory) -> dict:
    return run_ranks(
        public_loop.train, 1, "single", str(tmp_path_factory.mktemp("single")), "full"
    )[0]


def assert_same_as_single_and_resumes_bitwise(
    phases: dict[str, dict], single: dict, name: str, tolerance: float = TOLERANCE
) -> None:
    full, first, resumed = phases["full"], phases["first"], phases["resume"]
    assert (full["steps"], first["steps"], resumed["steps"]) == (6, 3, 6)
    # Clipping fired at every step, and each rank saw the global norm one process computes.
    assert all(norm > public_loop.MAX_NORM for norm in full["norms"]), full["norms"]
    torch.testing.assert_close(
        torch.tensor(full["norms"]), torch.tensor(single["norms"]), rtol=1e-5, atol=0
    )
    assert first["norms"] + resumed["norms"] == full["norms"], (
        f"{name}: the resumed steps saw other gradients"
    )
    # The resumed run really trained steps 4-6, and ended bitwise where the uninterrupted one did.
    assert max_param_diff(first["weights"], resumed["weights"]) > 100 * tolerance
    for key, value in full["weights"].items():
        assert torch.equal(value, resumed["weights"][key]), (
            f"{name}: resumed {key} differs from the uninterrupted run"
        )
    difference = max_param_diff(single["weights"], full["weights"])
    print(f"{name}: max |single - {name}| = {difference:.2e}")
    assert difference < tolerance


def test_single_process_resumes_bitwise(single, tmp_path):
    phases = _phases("single", 1, tmp_path)
    assert max_param_diff(phases["full"]["weights"], single["weights"]) == 0  # deterministic
    assert_same_as_single_and_resumes_bitwise(phases, single, "single")


def test_clipping_changes_the_single_process_run(single, tmp_path):
    """Guards the tests: the tight limit really changes the weights (clipping is not a no-op
    here)."""
    unclipped = run_ranks(public_loop.train, 1, "single", str(tmp_path), "full", 1e3)[0]
    assert max_param_diff(unclipped["weights"], single["weights"]) > 100 * TOLERANCE


@pytest.mark.parametrize(("strategy", "ranks"), [("single", 1), ("deepspeed-zero2", 2)])
def test_the_older_clip_then_step_spelling_takes_the_same_steps(strategy, ranks, single, tmp_path):
    """``rt.clip_grad_norm`` then ``rt.step`` is one clipped step, not two steps (ZeRO clips inside
    its step)."""
    older = run_ranks(
        public_loop.train, ranks, strategy, str(tmp_path), "full", public_loop.MAX_NORM, "clip"
    )[0]
    assert older["steps"] == single["steps"] == public_loop.STEPS
    torch.testing.assert_close(
        torch.tensor(older["norms"]), torch.tensor(single["norms"]), rtol=1e-5, atol=0
    )
    assert max_param_diff(older["weights"], single["weights"]) < TOLERANCE


def _step_twice(strategy: str) -> str:
    with rankwise.setup(strategy, seed=0) as rt:
        model = torch.nn.Linear(4, 2)
        model, optimizer = rt.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        rt.backward(model(torch.randn(2, 4)).sum(), model)
        rt.clip_grad_norm(model, optimizer, 1.0)
        try:
            rt.step(optimizer, model, max_norm=1.0)
        except RuntimeError as e:
            return str(e)
        return "no error"


@pytest.mark.multiproc
def test_clipping_twice_in_one_step_is_refused():
    assert "already clipped and took this step" in run_ranks(_step_twice, 1, "single")[0]


@pytest.mark.parametrize("name", STRATEGIES)
def test_public_loop_resumes_bitwise_and_matches_single(name, single, tmp_path):
    strategy, ranks = STRATEGIES[name]
    assert_same_as_single_and_resumes_bitwise(_phases(strategy, ranks, tmp_path), single, name)


def test_horovod_public_loop(single, tmp_path):
    """Horovod needs horovodrun's rendezvous: the same loop, started as a script."""
    import horovod.torch  # noqa: F401 - make test installs it; a missing Horovod fails here, never skips

    from rankwise.launch import Entry, LaunchConfig
    from rankwise.launch.horovodrun import launch

    phases = {}
    for phase, out in (
        ("full", tmp_path / "full"),
        ("first", tmp_path / "cut"),
        ("resume", tmp_path / "cut"),
    ):
        out.mkdir(exist_ok=True)
        launch(
            LaunchConfig(nproc_per_node=2),
            Entry(
                "tests.support.public_loop",
                ("--strategy", "horovod", "--phase", phase, "--out", str(out)),
            ),
        )
        phases[phase] = torch.load(out / f"result-{phase}.pt", weights_only=False)
    assert_same_as_single_and_resumes_bitwise(phases, single, "horovod")


def test_horovod_accumulation_without_grad_accum_is_refused_with_what_to_do():
    from rankwise.process import ProcessEnv
    from rankwise.strategies.horovod import Horovod

    strategy = Horovod(ProcessEnv.detect())  # not set up: no_sync reads only the loop facts
    with pytest.raises(RuntimeError, match=r"rt.prepare\(model, optimizer, grad_accum=N\)"):
        strategy.no_sync(torch.nn.Linear(1, 1))


@pytest.mark.multiproc  # inductor compiles the graph in a compiler subprocess
def test_prepare_compiles_the_model_in_place_and_dp_refuses():
    from torch._dynamo.utils import counters

    counters.clear()
    with rankwise.setup("single") as rt:
        model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        names = [name for name, _ in model.named_parameters()]
        model, _ = rt.prepare(model, compile=True)
        model(torch.randn(3, 6)).sum().backward()
        assert counters["stats"]["unique_graphs"] >= 1  # dynamo really captured the forward
        # checkpoints keep their keys
        assert [name for name, _ in model.named_parameters()] == names
    with rankwise.setup("dp") as rt, pytest.raises(ConfigError, match="use ddp"):
        rt.prepare(torch.nn.Linear(2, 2), compile=True)
