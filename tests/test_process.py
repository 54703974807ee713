import torch

from rankwise.process import (
    ProcessEnv,
    backend_for,
    device_for,
    first_slurm_host,
    gpus_too_few,
    threads_per_process,
)


def test_torchrun_variables(monkeypatch):
    for key, value in dict(
        RANK="3",
        LOCAL_RANK="1",
        WORLD_SIZE="4",
        LOCAL_WORLD_SIZE="2",
        GROUP_RANK="1",
        MASTER_ADDR="10.0.0.1",
        MASTER_PORT="29500",
    ).items():
        monkeypatch.setenv(key, value)
    env = ProcessEnv.detect()
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank) == (
        3,
        1,
        4,
        2,
        1,
    )
    assert (env.master_addr, env.master_port, env.source) == ("10.0.0.1", 29500, "torchrun")


def test_slurm_variables(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in dict(
        SLURM_PROCID="5",
        SLURM_NTASKS="8",
        SLURM_LOCALID="1",
        SLURM_NODEID="2",
        SLURM_NNODES="4",
        SLURM_NTASKS_PER_NODE="2(x4)",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="gpu[03-06]",
    ).items():
        monkeypatch.setenv(key, value)
    env = ProcessEnv.detect()
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank) == (
        5,
        1,
        8,
        2,
        2,
    )
    assert env.master_addr == "gpu03" and env.master_port == 15000 + 4242 and env.source == "slurm"


def test_single_process_when_nothing_is_set(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    env = ProcessEnv.detect()
    assert (env.rank, env.world_size, env.distributed, env.source) == (0, 1, False, "single")


def test_spawn_arguments_give_global_rank():
    env = ProcessEnv.from_spawn(1, 4, node_rank=2, nnodes=3, master_port=1234)
    assert (env.rank, env.world_size, env.local_world_size) == (9, 12, 4)


def test_slurm_host_lists():
    assert first_slurm_host("node1,node2") == "node1"
    assert first_slurm_host("gpu[12,15-16]") == "gpu12"


def test_device_and_backend(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_for(3) == torch.device("cpu") and backend_for(device_for(0)) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_for(3) == torch.device("cuda", 1) and backend_for(device_for(0)) == "nccl"


def test_threads_per_process(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("rankwise.process.usable_cores", lambda: 8)
    assert threads_per_process(2) == 4 and threads_per_process(16) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads_per_process(2) == 3


def test_only_more_local_ranks_than_visible_gpus_is_too_few(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert gpus_too_few(
        2
    ) is None and "3 processes per node but this node has 2 CUDA GPU(s)" in gpus_too_few(3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpus_too_few(8) is None  # the CPU: gloo takes any number of ranks
