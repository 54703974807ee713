"""Faults injected into real 2-rank `rankwise train` runs (``rankwise.testing.faults``), and what
the user sees.

A toy MLP with dropout (so every rank's RNG matters), 8 optimizer steps of a 42-step
epoch: every fault strikes mid-epoch.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from rankwise.checkpoint import read_weights
from tests.support.cli import RANK_VARIABLES, command_env, rankwise
from tests.support.tiers import starts_processes

JOB = (
    "--data",
    "toy",
    "--model",
    "mlp",
    "--set",
    "data.toy_samples=800",
    "--batch-size",
    "16",
    "--max-steps",
    "8",
    "--seed",
    "3",
    "--strategy",
    "ddp",
    "--nproc-per-node",
    "2",
    "--no-progress",
    "--set",
    "launch.timeout_s=20",
)


def train(
    out, *extra: str, fault: str | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    env = command_env(
        (*RANK_VARIABLES, "LOCAL_RANK"), **({"RANKWISE_TEST_FAULT": fault} if fault else {})
    )
    started = time.monotonic()
    proc = rankwise("train", *JOB, "--out", str(out), *extra, env=env, timeout=timeout, cwd=None)
    proc.wall_s = time.monotonic() - started
    return proc


def final_weights(out) -> dict:
    return read_weights(out / "checkpoints" / "latest")


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not (a[k] == b[k]).all()]
    assert not different, f"differ: {different}"


def no_process_mentions(text: str) -> bool:
    return subprocess.run(["pgrep", "-f", text], capture_output=True).returncode == 1


@pytest.fixture(scope="module")
@starts_processes()
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    proc = train(out, "--set", "save_every=2", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return final_weights(out)


@pytest.mark.multiproc
@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_a_rank_that_raises_is_named_first_and_the_others_stop_within_seconds(launcher, tmp_path):
    proc = train(tmp_path, "--launcher", launcher, fault="raise:rank=1:step=3")
    assert proc.returncode == 1
    first = proc.stderr.split("worker(s) failed:", 1)[1].strip().splitlines()[0]
    assert first.startswith("rank 1 (host ") and " failed first, with " in first, proc.stderr[
        -3000:
    ]
    assert first.endswith("RuntimeError: injected fault: rank 1 fails at step 3"), first
    assert "last traceback lines:" in proc.stderr and "in at_step_end" in proc.stderr
    # Far below the 20 s collective timeout a waiting rank 0 would otherwise sit out (start-up
    # included).
    assert proc.wall_s < 60, proc.wall_s
    assert no_process_mentions(str(tmp_path))


@pytest.mark.multiproc
def test_a_killed_rank_is_named_with_its_signal(tmp_path):
    proc = train(tmp_path, fault="kill:rank=1:step=3")
    assert proc.returncode == 1
    assert "rank 1 (host " in proc.stderr and "failed first, with signal SIGKILL" in proc.stderr, (
        proc.stderr[-3000:]
    )
    assert no_process_mentions(str(tmp_path))


def test_a_killed_rank_restarts_from_the_latest_checkpoint_and_ends_bitwise_equal(
    uninterrupted, tmp_path
):
    proc = train(
        tmp_path,
        "--set",
        "save_every=2",
        "--max-restarts",
        "1",
        "--json",
        fault="kill:rank=1:step=5",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed at step 4" in proc.stdout + proc.stderr  # the checkpoint before the kill
    assert json.loads(proc.stdout.strip().splitlines()[-1])["steps"] == 8
    assert_bitwise_equal(final_weights(tmp_path), uninterrupted)


@pytest.mark.multiproc
def test_an_exhausted_restart_budget_fails_saying_so(tmp_path):
    proc = train(
        tmp_path, "--set", "save_every=2", "--max-restarts", "1", fault="kill:rank=1:step=5:always"
    )
    assert proc.returncode == 1
    # the second attempt continued from the checkpoint
    assert "resumed at step 4" in proc.stdout + proc.stderr
    assert "rank 1 (host " in proc.stderr and "failed first, with signal SIGKILL" in proc.stderr, (
        proc.stderr[-3000:]
    )
    assert (
        "restarted 1 time(s) (--max-restarts 1) and failed again: restart budget exhausted"
        in proc.stderr
    )


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_sigterm_checkpoints_at_a_step_boundary_exits_143_and_resumes_exactly(
    launcher, uninterrupted, tmp_path
):
    # Rank 0 sends SIGTERM to the launcher after step 3, as a scheduler preempting the job would.
    proc = train(
        tmp_path, "--launcher", launcher, "--set", "save_every=2", fault="term:rank=0:step=3"
    )
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "stopped by SIGTERM" in proc.stderr and "--resume latest" in proc.stderr
    stopped_at = json.loads((tmp_path / "checkpoints" / "latest" / "manifest.json").read_text())[
        "step"
    ]
    # a checkpoint at the boundary where the ranks stopped, not at step 2
    assert 3 <= stopped_at < 8
    assert not (tmp_path / "result.json").exists()
    assert no_process_mentions(str(tmp_path))
    resumed = train(
        tmp_path, "--launcher", launcher, "--set", "save_every=2", "--resume", "latest", "--json"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_bitwise_equal(final_weights(tmp_path), uninterrupted)


@pytest.mark.multiproc
def test_sigint_checkpoints_and_exits_130(tmp_path):
    proc = train(tmp_path, fault="int:rank=0:step=3")
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "stopped by SIGINT" in proc.stderr
    assert (
        json.loads((tmp_path / "checkpoints" / "latest" / "manifest.json").read_text())["step"] >= 3
    )
    assert no_process_mentions(str(tmp_path))


@pytest.mark.multiproc
def test_a_hung_rank_is_named_within_the_timeout(tmp_path):
    proc = train(tmp_path, "--set", "launch.timeout_s=8", fault="hang:rank=1:step=2")
    assert proc.returncode == 1
    assert "rank 1 never arrived" in proc.stderr, proc.stderr[-3000:]
    assert proc.wall_s < 60, proc.wall_s
    assert no_process_mentions(str(tmp_path))


@pytest.mark.multiproc
def test_ranks_that_disagree_on_the_number_of_steps_are_told_what_differs():
    from tests.support.multiproc import RanksFailed, run_ranks

    with pytest.raises(
        RanksFailed, match="ranks disagree on total steps: rank 0 has 8, rank 1 has 9"
    ):
        run_ranks(_disagreeing_trainer, 2, timeout=60)


def _disagreeing_trainer() -> None:
    import torch.distributed as torch_dist

    from rankwise.data.prepare import prepare_data
    from rankwise.runtime import setup
    from rankwise.train.config import DataConfig, build_config
    from rankwise.train.loop import Trainer

    data = prepare_data(DataConfig(source="toy", toy_samples=400))
    with setup("ddp") as rt:
        cfg = build_config(
            overrides=[
                "strategy=ddp",
                "data.source=toy",
                "batch_size=16",
                "progress=false",
                f"max_steps={8 + torch_dist.get_rank()}",
            ]
        )
        import tempfile

        Trainer(cfg, data, tempfile.mkdtemp(), rt).fit()


def test_no_signal_handler_outlives_training():
    """The loop's SIGTERM / SIGINT handlers are restored when it ends (a notebook keeps its
    Ctrl-C)."""
    from rankwise.train.preemption import StopRequest

    before = signal.getsignal(signal.SIGINT)
    stop = StopRequest()
    assert signal.getsignal(signal.SIGINT) is not before
    stop.close()
    assert signal.getsignal(signal.SIGINT) is before
