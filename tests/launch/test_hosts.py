"""Node layout from a hostfile, Slurm's node list (rankwise.process) and a Kubeflow PyTorchJob
pod."""

from __future__ import annotations

import pytest

from rankwise import cli
from rankwise.cli.launch import command_line_parser
from rankwise.errors import ConfigError
from rankwise.launch.hosts import (
    layout_from_hostfile,
    layout_from_kubeflow,
    layout_from_slurm,
    parse_hostfile,
)
from rankwise.process import ProcessEnv, expand_nodelist
from rankwise.tools.harness import NodeLayout, check_layout
from rankwise.train import run
from rankwise.train.rundir import RunDir

HOSTFILE = """# the training cluster
10.0.0.1 slots=4   # master
node-b slots=2

node-c
"""


def test_hostfile_lines_comments_and_default_slots(tmp_path):
    path = tmp_path / "hosts.txt"
    path.write_text(HOSTFILE, encoding="utf-8")
    assert [(h.name, h.slots) for h in parse_hostfile(path)] == [
        ("10.0.0.1", 4),
        ("node-b", 2),
        ("node-c", 1),
    ]
    layout = layout_from_hostfile(path, names={"node-b", "192.168.1.7"})
    assert (layout.nnodes, layout.node_rank, layout.nproc_per_node, layout.master_addr) == (
        3,
        1,
        2,
        "10.0.0.1",
    )
    assert layout_from_hostfile(path, names={"10.0.0.1"}).node_rank == 0


@pytest.mark.parametrize(
    "text, message",
    [
        ("node-a slots=0\n", r"hosts.txt:1: expected 'HOST slots=N' with N >= 1"),
        ("node-a cpus=2\n", r"hosts.txt:1: expected 'HOST slots=N'"),
        ("node-a\n# x\nnode-a\n", r"hosts.txt:3: host 'node-a' is listed twice"),
        ("# nothing\n", r"hosts.txt: no hosts"),
    ],
)
def test_bad_hostfiles_name_the_line(text, message, tmp_path):
    path = tmp_path / "hosts.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        parse_hostfile(path)


def test_a_machine_missing_from_the_hostfile_is_told_so(tmp_path):
    path = tmp_path / "hosts.txt"
    path.write_text(HOSTFILE, encoding="utf-8")
    with pytest.raises(ConfigError, match="this machine .* is none of its hosts"):
        layout_from_hostfile(path, names={"elsewhere"})


def _configured(monkeypatch, tmp_path, *flags: str):
    """The launch settings `rankwise train --data toy --strategy ddp FLAGS` would start its workers
    with."""
    seen = {}
    monkeypatch.setattr(
        run, "prepare_run", lambda cfg, quiet: seen.setdefault("cfg", cfg) and RunDir(tmp_path)
    )
    monkeypatch.setattr(run, "launch_workers", lambda *a: None)
    monkeypatch.setattr(run, "report_run", lambda *a, **k: 0)
    assert cli.main(["train", "--data", "toy", "--strategy", "ddp", *flags]) == 0
    return seen["cfg"].launch


def test_train_takes_its_layout_from_the_hostfile(tmp_path, monkeypatch):
    path = tmp_path / "hosts.txt"
    path.write_text("127.0.0.1 slots=2\nother-node slots=2\n", encoding="utf-8")
    launch = _configured(monkeypatch, tmp_path, "--hostfile", str(path))
    assert (launch.nnodes, launch.node_rank, launch.nproc_per_node, launch.master_addr) == (
        2,
        0,
        2,
        "127.0.0.1",
    )


def test_slurm_compressed_node_lists_expand():
    assert expand_nodelist("gpu[03-05,9],cpu1") == ["gpu03", "gpu04", "gpu05", "gpu9", "cpu1"]
    assert expand_nodelist("a[1-2],b[08-10]") == ["a1", "a2", "b08", "b09", "b10"]
    assert expand_nodelist("single") == ["single"]


def test_slurm_task_environment_maps_to_ranks(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS_PER_NODE": "2(x2)",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }.items():
        monkeypatch.setenv(key, value)
    env = ProcessEnv.detect()
    assert (env.rank, env.local_rank, env.world_size, env.node_rank, env.master_addr) == (
        3,
        1,
        4,
        1,
        "gpu07",
    )


def test_a_kubeflow_pod_maps_to_launch_settings_and_is_not_taken_for_a_worker(
    monkeypatch, tmp_path
):
    pod = {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "4",
        "PET_MASTER_ADDR": "job-master-0",
        "PET_MASTER_PORT": "23456",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "23456",
    }
    assert layout_from_kubeflow(pod) == {
        "nnodes": 2,
        "node_rank": 1,
        "nproc_per_node": 4,
        "master_addr": "job-master-0",
        "master_port": 23456,
    }
    assert layout_from_kubeflow({"PET_NNODES": "1:3"})["nnodes"] == 3  # elastic: the maximum
    assert layout_from_kubeflow({}) is None
    for key, value in pod.items():
        monkeypatch.setenv(key, value)
    launch = _configured(monkeypatch, tmp_path, "--batch-size", "32")
    assert (launch.nnodes, launch.node_rank, launch.nproc_per_node, launch.master_port) == (
        2,
        1,
        4,
        23456,
    )


SLURM_AGENT = {
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
}
"""What `srun -N2 --ntasks-per-node=1 rankwise ...` gives the task on the second node."""


def test_one_slurm_task_per_node_is_that_nodes_agent():
    assert layout_from_slurm(SLURM_AGENT) == {
        "nnodes": 2,
        "node_rank": 1,
        "master_addr": "gpu07",
        "master_port": 15000 + 4242 % 20000,
    }
    # A step on part of the allocation: the step's nodes, not the job's.
    step = {
        **SLURM_AGENT,
        "SLURM_NNODES": "4",
        "SLURM_JOB_NODELIST": "gpu[05-08]",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
    }
    assert (
        layout_from_slurm(step)["master_addr"] == "gpu07" and layout_from_slurm(step)["nnodes"] == 2
    )
    # two per node: each a rank
    assert layout_from_slurm({**SLURM_AGENT, "SLURM_STEP_NUM_TASKS": "4"}) is None
    # The batch script's own step (rankwise run in it without srun) is node 0 of nothing: no srun
    # step variables.
    batch_step = {k: v for k, v in SLURM_AGENT.items() if not k.startswith("SLURM_STEP_")} | {
        "SLURM_NODEID": "0"
    }
    assert layout_from_slurm(batch_step) is None
    assert (
        layout_from_slurm({**SLURM_AGENT, "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "1"})
        is None
    )
    assert layout_from_slurm({}) is None


def _slurm(monkeypatch, env: dict) -> None:
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "PET_NNODES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_train_launch_and_doctor_under_srun_take_the_layout_from_slurm(
    monkeypatch, tmp_path, capsys
):
    _slurm(monkeypatch, SLURM_AGENT)
    launch = _configured(monkeypatch, tmp_path, "--nproc-per-node", "2")
    assert (launch.nnodes, launch.node_rank, launch.master_addr, launch.master_port) == (
        2,
        1,
        "gpu07",
        19242,
    )
    launched = []
    monkeypatch.setattr(
        "rankwise.cli.launch.launch_command_line", lambda argv, parser: launched.append(argv)
    )
    assert cli.main(["launch", "--nproc-per-node", "2", "--master-port", "29999", "x.py"]) == 0
    flags, _ = command_line_parser().parse_known_args(launched[0])
    assert (flags.nnodes, flags.node_rank, flags.master_addr, flags.master_port) == (
        "2",
        1,
        "gpu07",
        29999,
    )
    doctor = check_layout(NodeLayout(nproc_per_node=1), min_ranks=1)
    assert (doctor.nnodes, doctor.node_rank, doctor.master_addr) == (2, 1, "gpu07")


def test_train_as_one_of_several_slurm_tasks_per_node_is_refused(monkeypatch, capsys):
    _slurm(
        monkeypatch,
        {
            **SLURM_AGENT,
            "SLURM_NTASKS": "4",
            "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_TASKS_PER_NODE": "2(x2)",
        },
    )
    monkeypatch.setattr(run, "launch_workers", lambda *a: pytest.fail("workers were launched"))
    assert cli.main(["train", "--data", "toy", "--strategy", "ddp"]) == 2
    assert "under srun as one task per node (--ntasks-per-node=1)" in capsys.readouterr().err
