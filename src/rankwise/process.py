"""Who am I: rank, local rank, world size, node, device and backend of this process.

Read from torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...), from
horovodrun's (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ...), from Slurm's (``SLURM_PROCID``,
``SLURM_NTASKS``, ``SLURM_LOCALID``, ...), from arguments an ``mp.spawn`` worker
receives, or a single process when none is set.
"""

from __future__ import annotations

import datetime
import gc
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist

from rankwise.compat.torch_elastic import store_for_this_attempt


@dataclass(frozen=True)
class ProcessEnv:
    rank: int = 0
    """Global rank, 0 .. world_size-1."""
    local_rank: int = 0
    """Rank within this node; picks the device."""
    world_size: int = 1
    """Processes in the job."""
    local_world_size: int = 1
    """Processes on this node."""
    node_rank: int = 0
    """Rank of this node."""
    master_addr: str = "127.0.0.1"
    """Address of the process that hosts the rendezvous store."""
    master_port: int | None = None
    """Port of the rendezvous store."""
    source: str = "single"
    """Where the values came from: torchrun, horovod, slurm, spawn or single."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def detect(cls) -> ProcessEnv:
        env = os.environ
        if "RANK" in env and "WORLD_SIZE" in env:
            return cls(
                rank=int(env["RANK"]),
                local_rank=int(env.get("LOCAL_RANK", 0)),
                world_size=int(env["WORLD_SIZE"]),
                local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
                node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", 0))),
                master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                master_port=int(env["MASTER_PORT"]) if "MASTER_PORT" in env else None,
                source="torchrun",
            )
        if "HOROVOD_RANK" in env and "HOROVOD_SIZE" in env:
            return cls(
                rank=int(env["HOROVOD_RANK"]),
                local_rank=int(env.get("HOROVOD_LOCAL_RANK", 0)),
                world_size=int(env["HOROVOD_SIZE"]),
                local_world_size=int(env.get("HOROVOD_LOCAL_SIZE", env["HOROVOD_SIZE"])),
                node_rank=int(env.get("HOROVOD_CROSS_RANK", 0)),
                master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                master_port=int(env["MASTER_PORT"]) if "MASTER_PORT" in env else None,
                source="horovod",
            )
        if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", 1)) > 1:
            return cls.from_slurm(env)
        return cls()

    @classmethod
    def from_slurm(cls, env: dict[str, str] | os._Environ) -> ProcessEnv:
        ntasks = int(env["SLURM_NTASKS"])
        nnodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", 1)))
        # SLURM_NTASKS_PER_NODE looks like "4" or "4(x2)"; fall back to an even split.
        per_node = env.get("SLURM_NTASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", ""))
        match = re.match(r"(\d+)", per_node)
        local_world_size = int(match.group(1)) if match else max(1, ntasks // nnodes)
        return cls(
            rank=int(env["SLURM_PROCID"]),
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            world_size=ntasks,
            local_world_size=local_world_size,
            node_rank=int(env.get("SLURM_NODEID", 0)),
            master_addr=env.get("MASTER_ADDR")
            or first_slurm_host(
                # the step's hosts
                env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "127.0.0.1")
            ),
            master_port=int(env.get("MASTER_PORT") or slurm_port(env)),
            source="slurm",
        )

    @classmethod
    def from_spawn(
        cls,
        local_rank: int,
        nproc_per_node: int,
        *,
        node_rank: int = 0,
        nnodes: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int,
    ) -> ProcessEnv:
        return cls(
            rank=node_rank * nproc_per_node + local_rank,
            local_rank=local_rank,
            world_size=nproc_per_node * nnodes,
            local_world_size=nproc_per_node,
            node_rank=node_rank,
            master_addr=master_addr,
            master_port=master_port,
            source="spawn",
        )

    def export(self) -> None:
        """Write the torchrun-style variables, so libraries that read them (and user code) agree
        with us."""
        os.environ.update(
            RANK=str(self.rank),
            LOCAL_RANK=str(self.local_rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_WORLD_SIZE=str(self.local_world_size),
            GROUP_RANK=str(self.node_rank),
            MASTER_ADDR=self.master_addr,
        )
        if self.master_port is not None:
            os.environ["MASTER_PORT"] = str(self.master_port)


def restart_count() -> int:
    """How often torchrun has restarted this worker group (0 in the first attempt, and outside
    torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def slurm_port(env) -> int:
    """The rendezvous port of a Slurm job: every task (or node agent) must agree on it without
    talking, so it follows from the job id (``15000 + SLURM_JOB_ID % 20000``, what
    ``examples/slurm.sbatch`` computes too)."""
    return 15000 + int(env.get("SLURM_JOB_ID", 0)) % 20000


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``gpu[03-05,9],cpu1`` -> ``gpu03``."""
    return expand_nodelist(nodelist)[0]


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list: ``gpu[03-05,9],cpu1`` -> gpu03 gpu04 gpu05 gpu9 cpu1 (zero
    padding kept)."""
    hosts = []
    for prefix, ranges, _ in re.findall(r"([^,\[]+)(?:\[([^\]]+)\])?(,|$)", nodelist):
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            if not last:
                hosts.append(prefix + first)
                continue
            width = len(first)
            hosts.extend(f"{prefix}{n:0{width}d}" for n in range(int(first), int(last) + 1))
    return hosts


def device_for(local_rank: int) -> torch.device:
    """One CUDA device per local rank when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def gpus_too_few(local_processes: int) -> str | None:
    """Why ``local_processes`` ranks cannot share this node's CUDA GPUs, or ``None`` when they need
    not share.

    Each local rank takes its own GPU (``device_for``) and talks NCCL, which refuses two ranks on
    one device ("Duplicate GPU detected"), so a node needs a GPU per rank.  Seen on an H100 machine:
    ``--nproc-per-node 2`` on its one GPU failed at the DDP wrap with that NCCL error.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if 0 < gpus < local_processes:
        return (
            f"{local_processes} processes per node but this node has {gpus} CUDA GPU(s): each rank "
            f"needs its own GPU (NCCL refuses two ranks on one); use --nproc-per-node {gpus}, or "
            "train on the CPU with CUDA_VISIBLE_DEVICES= (gloo)"
        )
    return None


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(env: ProcessEnv, device: torch.device, timeout_s: float = 300.0) -> None:
    """Join the job's process group (no-op when already joined).

    A one-process "group" (e.g. ``--strategy ddp --nproc-per-node 1``) needs no
    rendezvous: it uses an in-memory store, so it works without MASTER_PORT.
    """
    if torch_dist.is_initialized():
        return
    if not env.distributed:
        torch_dist.init_process_group(
            backend=backend_for(device),
            store=torch_dist.HashStore(),
            rank=0,
            world_size=1,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        return
    if env.master_port is None:
        raise RuntimeError(
            f"rank {env.rank}: MASTER_PORT is not set; start the job with `rankwise launch` or set "
            "it"
        )
    env.export()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG"):
        # Read once when torch.distributed is imported, often before the variable was set
        # (launch.check_collectives).
        torch_dist.set_debug_level_from_env()
    # A restarted worker group gets a key space of its own on torchrun's agent store
    # (rankwise.compat).
    store = store_for_this_attempt(
        env.master_addr, env.master_port, env.world_size, restart_count(), timeout
    )
    if store is not None:
        torch_dist.init_process_group(
            backend=backend_for(device),
            store=store,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
        )
        return
    torch_dist.init_process_group(
        backend=backend_for(device),
        init_method="env://",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
    )


def destroy_process_group(clean: bool = True, destroy: Callable[[], None] | None = None) -> None:
    """Leave the process group (``destroy``: a library's own teardown of it, torch's by default).

    torch 2.13 on gloo aborts at exit about one run in three when a DDP module is still
    alive at ``destroy_process_group()``; callers drop their wrapped modules first, then
    we collect them and, after a successful run, meet at a barrier so no rank tears down
    while another still communicates.  After a failure we skip the barrier: the peers
    may never reach it, and the launcher stops them.
    """
    from rankwise import dist

    dist.forget_groups()
    if not torch_dist.is_initialized():
        # (nothing to protect: no collection, which costs a quarter of a second with torch loaded)
        return
    gc.collect()
    try:
        if clean:
            # Why: a rank that destroys its group while a peer is mid-collective makes the peer hang
            # or abort.
            torch_dist.barrier()
    finally:
        (destroy or torch_dist.destroy_process_group)()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_process(local_processes: int) -> int:
    """OMP threads each local process should use: the user's OMP_NUM_THREADS, else cores /
    processes."""
    if os.environ.get("OMP_NUM_THREADS"):
        return int(os.environ["OMP_NUM_THREADS"])
    return max(1, usable_cores() // max(1, local_processes))


MMAP_THRESHOLD_BYTES = 1 << 20
"""The fixed glibc mmap threshold of a rank whose strategy gathers and frees whole layers."""
MMAP_THRESHOLD_MAX = 32 << 20
"""glibc's ceiling for its moving threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``): where the
moving threshold ends up once a step's largest blocks have been freed."""
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter for the mmap threshold (``malloc.h``)."""


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix this process's glibc mmap threshold at ``threshold`` bytes (``mallopt``): blocks that
    large are mapped when allocated and handed back to the system when freed.  Unless the user set
    ``MALLOC_MMAP_THRESHOLD_`` (glibc applied theirs at start).  Returns whether it was set (Linux's
    glibc only; elsewhere nothing changes).

    Only a strategy that gathers and frees whole layers every step asks for it
    (:attr:`rankwise.strategies.base.Strategy.gathers_layers`): with glibc's moving threshold, such
    blocks come from the heap, whose freed pages stay resident, and a CPU rank's RSS grew to twice
    its live memory (BERT-base FSDP: 2.4 GB instead of 1.25).  Anywhere else it only costs time:
    every step's activations of 1 MiB or more are then mapped and zeroed anew (the built-in model's
    step, one thread: 204 ms against 125 ms)."""
    import ctypes
    import ctypes.util

    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False
