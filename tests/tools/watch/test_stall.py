"""The stall deadline: a process that makes no progress is stopped with every thread's stack, read
back as where it waited (the whole command: tests/tools/watch/test_verify_scripts.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rankwise.tools.watch.stall import describe, in_script, parse_dump, read_dumps

DUMPS = Path(__file__).parents[2] / "support" / "tools" / "watch" / "dumps"


def test_a_dump_names_the_main_threads_line_in_the_script_and_its_innermost_frame():
    # A real dump (rank 1 of tests/support/tools/watch/scripts/stalls.py waiting for rank 0 in DDP's
    # all-reduce), its paths shortened, with a second thread ahead of the main one as faulthandler
    # lists them.
    dump = parse_dump((DUMPS / "rank1-in-backward.txt").read_text())
    assert dump.who == "rank1" and dump.seconds == 8 and dump.timed_out
    assert len(dump.threads) == 2 and dump.main[0].function == "_engine_run_backward"
    assert str(in_script(dump.main, "/home/user/project/train.py")) == "train.py:20 in <module>"
    # the script unknown: the innermost not a library
    assert str(in_script(dump.main)) == "train.py:20 in <module>"
    assert describe([dump], "/home/user/project/train.py") == (
        "rank 1 made no progress for 8 s and was stopped; it waited at train.py:20 in <module> "
        "(torch/autograd/graph.py:979 in _engine_run_backward)"
    )
    stopped = parse_dump(
        (DUMPS / "rank1-in-backward.txt").read_text().replace("Timeout (0:00:08)!\n", "")
    )
    # a SIGTERM's stack alone is no stall
    assert not stopped.timed_out and describe([stopped]) is None
    assert (
        parse_dump("rankwise stall deadline: rank0 main thread 0x00007f0000000001 seconds 8\n")
        is None
    )


WAITS = textwrap.dedent("""\
    import sys, time
    from rankwise.tools.watch import stall
    stall.arm(float(sys.argv[2]), sys.argv[1], sys.argv[3])
    for _ in range(8):  # 2 s of progress: past the 1 s deadline, which it keeps pushing back
        time.sleep(0.25)
        stall.progress()
    def waits():
        print("waiting", flush=True); time.sleep(60)  # (one line: SIGTERM finds it here)
    waits()
    """)


@pytest.mark.multiproc
def test_a_process_without_progress_is_stopped_with_its_stack_and_a_sigterm_writes_it_too(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(WAITS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    started = time.monotonic()
    stalled, stopped = (
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / f"stall-{who}-pid{n}.txt"), seconds, who],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n, (seconds, who) in enumerate((("1", "rank3"), ("60", "rank4")))
    )
    try:
        assert stopped.stdout.readline() == "waiting\n"
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(timeout=30) == -signal.SIGTERM
        assert stalled.wait(timeout=30) == 1  # faulthandler's exit
        # its progress kept it going past its 1 s deadline
        assert stalled.stdout.read() == "waiting\n"
    finally:
        for proc in (stalled, stopped):
            proc.kill()
    assert time.monotonic() - started < 20
    dumps = read_dumps(tmp_path)
    assert [(dump.who, dump.timed_out) for dump in dumps] == [("rank3", True), ("rank4", False)]
    assert all(str(dump.main[0]) == "waits.py:8 in waits" for dump in dumps), [
        dump.main for dump in dumps
    ]
    assert describe(dumps, script).splitlines() == [
        "rank 3 made no progress for 1 s and was stopped; it waited at waits.py:8 in waits",
        "rank 4 was stopped by its launcher meanwhile; it waited at waits.py:8 in waits",
    ]


WAITS_FOR_OTHERS = textwrap.dedent("""\
    import sys, time
    from rankwise.tools.watch import stall
    stall.arm(1.0, sys.argv[1], sys.argv[2])
    stall.progress()  # its first progress: from here on the run's progress decides
    started = time.monotonic()
    if sys.argv[2] == "rank0":  # rank 0 works alone for 3 s (rank 0's evaluation, say), then stops
        while time.monotonic() - started < 3:
            time.sleep(0.1)
            stall.progress()
        time.sleep(60)
    else:  # rank 1 waits for it all along (a barrier)
        time.sleep(60)
    """)


@pytest.mark.multiproc
def test_a_rank_waiting_while_another_works_is_not_stalled_until_the_whole_run_stops(tmp_path):
    script = tmp_path / "waits_for_others.py"
    script.write_text(WAITS_FOR_OTHERS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    started = time.monotonic()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / f"stall-rank{r}-pid{r}.txt"), f"rank{r}"],
            env=env,
        )
        for r in (0, 1)
    ]
    try:
        codes = [rank.wait(timeout=30) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    ended = time.monotonic() - started
    assert codes == [1, 1]  # both stopped by their deadline once nothing moved for 1 s ...
    # ... not while rank 0 worked: rank 1's own deadline (1 s) followed the run's progress
    assert ended > 3.5
    assert [dump.who for dump in read_dumps(tmp_path) if dump.timed_out] == ["rank0", "rank1"]


@pytest.mark.unit
def test_building_a_cpp_extension_counts_as_progress():
    """DeepSpeed compiles its CPU Adam on first use (minutes without a cache) while the other rank
    waits on the build's file baton: neither is stalled."""
    from rankwise.tools.watch.stall import building

    assert not building()
    code = compile("found = building()", "/site-packages/torch/utils/cpp_extension.py", "exec")
    scope = {"building": building}
    exec(code, scope)
    assert scope["found"]
    # (waiting on the build's lock is not: a lock a stopped build left would wait for ever)
    baton = compile("found = building()", "/site-packages/torch/utils/file_baton.py", "exec")
    scope = {"building": lambda: exec(baton, inner) or inner["found"]}
    inner = {"building": building}
    exec(code, scope)
    assert not scope["found"]


@pytest.mark.unit
def test_a_rank_stopped_on_a_build_lock_is_told_where_the_lock_is():
    from rankwise.launch.stacks import Dump, Frame

    frames = [
        Frame("/site-packages/torch/utils/file_baton.py", 50, "wait"),
        Frame("/work/train.py", 341, "main"),
    ]
    dump = Dump("rank0", 120.0, True, "0x1", {"0x1": frames})
    said = describe([dump], "/work/train.py")
    assert "made no progress for 120 s" in said and "train.py:341" in said
    assert "~/.cache/torch_extensions" in said
