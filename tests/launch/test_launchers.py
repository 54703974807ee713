import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import rankwise
from rankwise.errors import LaunchError
from rankwise.launch import Entry, LaunchConfig
from rankwise.launch.ports import free_port, port_in_use
from rankwise.launch.torchrun import torchrun_args
from tests.support.cli import RANK_VARIABLES, ROOT, command, command_env
from tests.support.launch.rank_probe import main as probe

RANKWISE = command()
PROBE = str(Path(__file__).parents[1] / "support" / "launch" / "rank_probe.py")


def _read_ranks(out: Path) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("rank-*.json")}


def _env_without_dist():
    return command_env((*RANK_VARIABLES, "OMP_NUM_THREADS"), PYTHONPATH=str(ROOT))


@pytest.mark.multiproc
def test_rankwise_launch_starts_every_rank(tmp_path):
    proc = subprocess.run(
        [*RANKWISE, "launch", "--nproc-per-node", "2", PROBE, str(tmp_path)],
        env=_env_without_dist(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    ranks = _read_ranks(tmp_path)
    assert set(ranks) == {0, 1}
    for rank, seen in ranks.items():
        assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"]) == (str(rank), str(rank), "2")
        assert seen["runtime"] == [rank, rank, 2]
        assert seen["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert ranks[0]["MASTER_PORT"] == ranks[1]["MASTER_PORT"]


def _probe_rank(local_rank: int, out_dir: str) -> None:
    probe(out_dir)


@pytest.mark.multiproc
def test_spawn_launcher_starts_every_rank(tmp_path):
    rankwise.spawn(_probe_rank, 2, args=(str(tmp_path),))
    ranks = _read_ranks(tmp_path)
    assert set(ranks) == {0, 1}
    assert all(
        seen["runtime"] == [r, r, 2] and seen["WORLD_SIZE"] == "2" for r, seen in ranks.items()
    )


def _fail_on_rank_one(local_rank: int) -> None:
    if local_rank == 1:
        raise ValueError("bad shard on purpose")


@pytest.mark.multiproc
def test_spawn_failure_names_the_rank():
    expected = (
        r"rank 1 \(host \S+, local rank 1, pid \d+\) failed first, with an exception: "
        r"ValueError: bad shard on purpose\n    last traceback lines:"
    )
    with pytest.raises(LaunchError, match=expected):
        rankwise.spawn(_fail_on_rank_one, 2)


def _victim_first(local_rank: int) -> None:
    import time

    # what a peer of a crashed rank reports, here before the crash itself is known
    if local_rank == 0:
        raise RuntimeError("Connection closed by peer [127.0.0.1]:6313")
    time.sleep(0.5)
    raise ValueError("the real cause")


@pytest.mark.multiproc
def test_spawn_names_the_cause_even_when_a_victim_exits_first():
    # join() reports whichever process it sees exit first: here the victim, every time.
    with pytest.raises(LaunchError) as failed:
        rankwise.spawn(_victim_first, 2)
    summary = str(failed.value)
    assert re.search(
        r"rank 1 \(host \S+, local rank 1, pid \d+\) failed first, with an exception: "
        r"ValueError: the real cause",
        summary,
    ), summary
    assert re.search(
        r"rank 0 .* also failed, with an exception: RuntimeError: Connection closed by peer",
        summary,
    )


@pytest.mark.multiproc
def test_launch_failure_names_the_rank_and_exits_nonzero(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys\nif os.environ['RANK'] == '1':\n    raise RuntimeError('rank one broke')\n"
    )
    proc = subprocess.run(
        [*RANKWISE, "launch", "--nproc-per-node", "2", str(script)],
        env=_env_without_dist(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert re.search(
        r"rank 1 \(host \S+, local rank 1, pid \d+\) failed first, with exit code 1", proc.stderr
    ), proc.stderr[-3000:]
    assert "RuntimeError: rank one broke" in proc.stderr


def test_a_launch_config_becomes_torchruns_own_settings():
    static = torchrun_args(
        LaunchConfig(
            nproc_per_node=2,
            nnodes=2,
            node_rank=1,
            master_addr="10.0.0.2",
            master_port=29400,
            max_restarts=3,
        ),
        Entry("pkg.worker", ("--x", "1")),
    )
    assert (
        static.nproc_per_node,
        static.nnodes,
        static.node_rank,
        static.master_addr,
        static.master_port,
        static.max_restarts,
    ) == ("2", "2", 1, "10.0.0.2", 29400, 3)
    assert (
        static.module
        and static.training_script == "pkg.worker"
        and static.training_script_args == ["--x", "1"]
    )
    assert "timeout=300" in static.rdzv_conf  # two nodes wait for each other launch.timeout_s
    rdzv = torchrun_args(
        LaunchConfig(
            nproc_per_node=4, nnodes=2, rdzv_backend="c10d", rdzv_endpoint="h:1", rdzv_id="job"
        ),
        Entry("pkg"),
    )
    assert (rdzv.rdzv_backend, rdzv.rdzv_endpoint, rdzv.rdzv_id) == ("c10d", "h:1", "job")
    elastic = torchrun_args(
        LaunchConfig(nnodes="1:2", rdzv_backend="c10d", rdzv_endpoint="h:1", timeout_s=30),
        Entry("pkg"),
    )
    assert (
        elastic.nnodes == "1:2"
        and elastic.rdzv_conf == "timeout=30,join_timeout=30,last_call_timeout=30"
    )
    one_node = torchrun_args(LaunchConfig(nproc_per_node=2), Entry("pkg"))
    assert one_node.rdzv_conf == "" and one_node.nnodes == "1"


def test_every_launcher_is_in_the_table():
    from rankwise.launch import LAUNCHERS
    from rankwise.launch.config import LAUNCHERS as NAMES

    assert set(LAUNCHERS) == set(NAMES)


def test_rendezvous_endpoint_and_timeout_from_torchrun_flags():
    from rankwise.launch.torchrun import _rendezvous_endpoint, _rendezvous_timeout, get_args_parser

    def parse(*flags):
        return get_args_parser().parse_args([*flags, "x.py"])

    static = parse(
        "--nnodes=2", "--master-addr=10.0.0.1", "--master-port=1234", "--rdzv-conf=timeout=42"
    )
    assert (_rendezvous_endpoint(static), _rendezvous_timeout(static)) == (("10.0.0.1", 1234), 42.0)
    c10d = parse("--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0")
    assert (_rendezvous_endpoint(c10d), _rendezvous_timeout(c10d)) == (("node0", 29400), 600.0)


def test_free_port_is_free():
    port = free_port()
    assert 1024 <= port <= 65535 and not port_in_use(port)
