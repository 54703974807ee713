"""One mistake, one message: a failure summary names the rank that failed first with its error once,
where the script made the call for a rankwise error, and the ranks that failed the same way by
number only."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rankwise.errors import LaunchError
from rankwise.launch.failures import RankFailure, script_frame
from tests.support.cli import ROOT
from tests.support.tools.verify import CASES, loader_line

SENTENCE = "batch_size=15 is not divisible by world_size (2) x grad_accum (1) = 2"

TRACEBACK = f"""Traceback (most recent call last):
  File "{ROOT}/src/rankwise/launch/script.py", line 26, in run_as_main
    runpy.run_path(str(path), run_name="__main__")
  File "/home/me/train.py", line 9, in <module>
    loader = rt.loader(data, 15)
  File "{ROOT}/src/rankwise/runtime/__init__.py", line 187, in loader
    micro_batch_size(batch_size, self.world_size)
rankwise.errors.ConfigError: {SENTENCE}
"""


def _failure(rank: int, error: str, timestamp: float, traceback: str = TRACEBACK) -> RankFailure:
    return RankFailure(rank, rank, 100 + rank, "exit code 1", error, traceback, "host", timestamp)


def test_the_users_frame_is_the_innermost_outside_python_libraries_and_rankwise():
    assert script_frame(TRACEBACK) == "/home/me/train.py, line 9: loader = rt.loader(data, 15)"
    assert (
        script_frame(f'  File "{ROOT}/src/rankwise/runtime/__init__.py", line 1, in x\n    y\n')
        is None
    )


def test_ranks_failing_alike_are_named_once_and_a_rankwise_error_shows_where_not_a_traceback():
    error = f"ConfigError: {SENTENCE}"
    summary = str(
        LaunchError.from_ranks(
            [_failure(2, error, 3.0), _failure(0, error, 1.0), _failure(1, error, 2.0)]
        )
    )
    assert summary.count(SENTENCE) == 1, summary
    assert (
        "rank 0 (host host, local rank 0, pid 100) failed first, with exit code 1: ConfigError:"
        in summary
    )
    assert "    where: /home/me/train.py, line 9: loader = rt.loader(data, 15)" in summary
    assert "ranks 1, 2 failed the same way" in summary and "Traceback" not in summary


def test_another_error_keeps_its_traceback_lines_and_other_failures_their_own_line():
    error = "RuntimeError: shapes do not match"
    trace = TRACEBACK.replace(f"rankwise.errors.ConfigError: {SENTENCE}", error)
    summary = str(
        LaunchError.from_ranks(
            [
                _failure(0, error, 1.0, trace),
                _failure(1, "terminated by the launcher after another rank failed", 2.0),
            ]
        )
    )
    assert "last traceback lines:" in summary and "loader = rt.loader(data, 15)" in summary
    assert (
        "rank 1 (host host, local rank 1, pid 101) also failed" in summary
        and "same way" not in summary
    )


@pytest.mark.multiproc
def test_a_mistake_every_rank_makes_is_printed_once_by_rankwise_launch(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "launch",
            "--nproc-per-node",
            "2",
            str(CASES),
            "--batch-size",
            "15",
            "--grad-accum",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert output.count(SENTENCE) == 1 and "Traceback" not in output, output
    assert (
        f"where: {CASES}, line {loader_line()}: loader = rt.loader(dataset, "
        "batch_size=micro_batch, shuffle=True)" in output
    )
    # The other rank raised the same (named by number) or torchrun stopped it first, the group
    # having failed.
    assert any(
        f"rank {r} failed the same way" in output
        or f"local rank {r}, pid" in output
        and "terminated by the launcher after another rank failed" in output
        for r in (0, 1)
    ), output
