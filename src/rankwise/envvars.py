"""Every environment variable rankwise reads or sets: one registry, the source of the docs'
reference page.

Environment variables cross layers (a tool sets one, a rank of the user's script reads it) and
processes (a launcher sets one, the workers inherit it), so each is written down here once with who
sets it, who reads it and what it means.  ``scripts/docs_reference.py`` renders :data:`VARIABLES` as
the environment variables page, and ``tests/test_envvars.py`` fails when the source reads a
``RANKWISE_*`` variable that is not registered here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    """One environment variable and its contract."""

    name: str
    """The variable's name (a trailing ``*`` stands for a family: ``LT_*``)."""
    set_by: str
    """Who sets it: the user, a rankwise command (and which module), or a test."""
    read_by: str
    """The module or script that reads it."""
    meaning: str
    """What it means, its values and its default."""
    scope: str = "rankwise"
    """``rankwise``: rankwise's own; ``foreign``: another library's variable that rankwise sets or
    reads; ``development``: read only by the tests, the Makefile or the scripts in ``scripts/`` and
    ``examples/``."""


VARIABLES: tuple[EnvVar, ...] = (
    # rankwise's own: the launcher's strategy choice, read by rankwise.setup() in every rank
    EnvVar(
        "RANKWISE_STRATEGY",
        "`rankwise launch --strategy`, `bench --script`, `verify` (`launch/choice.py`)",
        "`rankwise.setup()` (`launch/choice.py`)",
        "The strategy a script on `rankwise.setup()` runs under when it names none; a script that "
        "names another one is refused, naming both.",
    ),
    EnvVar(
        "RANKWISE_PRECISION",
        "`rankwise launch --precision`, `bench --script`, `verify` (`launch/choice.py`)",
        "`rankwise.setup()` (`launch/choice.py`)",
        "`32-true`, `bf16-mixed` or `16-mixed`, for a script that passes no precision to "
        "`setup()`.",
    ),
    EnvVar(
        "RANKWISE_OPTIONS",
        "`rankwise launch --set SECTION.KEY=V` (`launch/choice.py`)",
        "`rankwise.setup()` (`launch/choice.py`)",
        "The chosen strategy's options as JSON (`ddp.*`, `deepspeed.*`, `horovod.*` keys).",
    ),
    EnvVar(
        "RANKWISE_TRUST_CHECKPOINT",
        "the user, or `rankwise train --trust-checkpoint` (`train/run.py`)",
        "`checkpoint/loading.py`",
        "`1`/`true`/`yes`: load a checkpoint `.pt` file that names Python globals outside the "
        "allowed list (it can run code when unpickled). Only for a checkpoint from someone you "
        "trust.",
    ),
    EnvVar(
        "RANKWISE_LAUNCH_ID",
        "`rankwise train` (`train/run.py`), a fresh id per launching process",
        "`train/loop.py`, `train/run.py`",
        "Which launching process's workers wrote `result.json`: on a shared `--out` only the node "
        "whose workers wrote it reports it.",
    ),
    # the watcher: the probe of `bench --script` and `verify` in every script (rankwise.setup(),
    # plain torch, Accelerate, Trainer, Fabric)
    EnvVar(
        "RANKWISE_WATCH",
        "`verify`, `bench --script` (`tools/watch/runs.py`)",
        "`tools/watch/settings.py`",
        "The watcher's settings, whole, as JSON (`WatchSettings.to_environment()`): the directory "
        "each rank of the script writes its trace, record and measurements to, the steps watched "
        "and the warm-up, whether to trace, the run it follows and its batch scale, dropout, the "
        "timed window's least seconds, what to do after the window, the steps profiled, the "
        "stall timeout and an `mp.spawn` script's role; their defaults are the dataclass's.",
    ),
    EnvVar(
        "RANKWISE_EXIT_GRACE_S",
        "the user; `launch --exit-grace`",
        "`launch/exits.py` (every launched rank)",
        "Seconds a rank that finished its work may take to exit before it is named and ended "
        "(default 30; 0: no limit).",
    ),
    EnvVar(
        "RANKWISE_EXIT_DIR",
        "`launch/torchrun.py` (a temporary directory)",
        "`launch/exits.py`",
        "Where each rank's exit guard writes its stacks for the launcher to read back.",
    ),
    EnvVar(
        "RANKWISE_WATCH_ORIGIN",
        "`tools/watch/runs.py`",
        "`tools/watch/workdir.py`",
        "The user's directory a watched run's scratch mirrors: a write through one of the "
        "mirror's links into it replaces the link first.",
    ),
    EnvVar(
        "RANKWISE_WATCH_DEEPSPEED",
        "`tools/watch/frameworks.py`",
        "`tools/watch/deepspeed_engine.py`",
        "Set for a DeepSpeed-engine script: the watcher takes each step at `engine.step()`.",
    ),
    EnvVar(
        "RANKWISE_WATCH_HOROVOD",
        "`tools/watch/frameworks.py`",
        "`tools/watch/horovod_optimizer.py`",
        "Set for a Horovod script: the watcher takes each step at the DistributedOptimizer's "
        "`step`.",
    ),
    EnvVar(
        "RANKWISE_WATCH_LIGHTNING",
        "`tools/watch/frameworks.py`",
        "`tools/watch/lightning.py`",
        "`1`: a Lightning Trainer script; each Trainer is built on the launcher's devices.",
    ),
    # `rankwise plan --validate`: the probe in every rank of the real runs it measures
    EnvVar(
        "RANKWISE_PLAN_PROBE",
        "`plan --validate` (`tools/plan/validate.py`)",
        "`tools/plan/probe.py`",
        "Directory each measured rank writes its peak tensor memory and steady step time to "
        "(`probe-rank<R>.json`).",
    ),
    # the documentation tests: every documented command at a smoke size
    EnvVar(
        "RANKWISE_SMOKE",
        "`make test-docs` (`tests/support/docs/codeblocks.py`), or the user",
        "`cli/smoke.py`, once per command (then removed from the environment its processes get)",
        "`1`/`true`/`yes`: the command runs at a smoke size, every check kept: `train` at most "
        "4 optimizer steps; `bench` the smoke preset, one repeat (`--script`: 3 timed steps, no "
        "least window, 2-step equivalence checks); `verify` 2 compared steps; `comm bench` "
        "messages up to 1 MiB, 3 timed calls. Each command says on stderr what it capped.",
    ),
    EnvVar(
        "RANKWISE_ALLOCATOR",
        "`scripts/allocator_bench.py`, for the runs it starts",
        "the `sitecustomize` that script writes",
        "`glibc`: the run keeps glibc's moving mmap threshold even where its strategy would fix "
        "it (the measurement behind `Strategy.gathers_layers`).",
        "development",
    ),
    # test-only
    EnvVar(
        "RANKWISE_TEST_FAULT",
        "tests (`tests/launch/test_faults.py`)",
        "`testing/faults.py`, `tools/comm/demo.py`",
        "Test-only fault injection, e.g. `raise:rank=1:step=3`, `kill:...`, `hang:...`, "
        "`term:...`, `int:...`.",
    ),
    # development: tests, Makefile, scripts/ and examples/
    EnvVar(
        "RANKWISE_TEST_INSTALL",
        "`make test`",
        "`tests/launch/test_slurm.py`",
        "`1`: the Slurm tests may install `slurm-wlm` with apt-get; otherwise they skip, saying "
        "so.",
        "development",
    ),
    EnvVar(
        "RANKWISE_SLURM_DIR",
        "the user",
        "`scripts/local_slurm.sh`",
        "State directory of the local test cluster (default `/tmp/rankwise-slurm`).",
        "development",
    ),
    EnvVar(
        "RANKWISE_SLURM_WAIT_S",
        "the user",
        "`scripts/local_slurm.sh`",
        "Seconds to wait for the local cluster's nodes to come up (default 40).",
        "development",
    ),
    EnvVar(
        "RANKWISE_WHEEL_CACHE",
        "the user",
        "`scripts/build_horovod.sh`",
        "Where the patched Horovod wheel is cached (default `~/.cache/rankwise/wheels`).",
        "development",
    ),
    EnvVar(
        "RANKWISE_ARGS",
        "the user (`sbatch`), `tests/launch/test_slurm.py`",
        "`examples/slurm.sbatch`",
        "What to train (default `--data sentiment --strategy ddp`).",
        "development",
    ),
    EnvVar(
        "RANKWISE_OUT",
        "the user (`sbatch`), `tests/launch/test_slurm.py`",
        "`examples/slurm.sbatch`",
        "The run directory, on a filesystem every node sees (default `runs/slurm-<job id>`).",
        "development",
    ),
    # other libraries' variables that rankwise sets or reads
    EnvVar(
        "OMP_NUM_THREADS",
        "the user; else the launchers (`launch/ports.py`)",
        "torch; `process.py`, `doctor`",
        "Threads per process; default usable cores / local processes.",
        "foreign",
    ),
    EnvVar(
        "MALLOC_MMAP_THRESHOLD_",
        "the user",
        "glibc; `process.py` (`fix_mmap_threshold`)",
        "Unset, a CPU rank whose strategy gathers and frees whole layers every step (FSDP, "
        "ZeRO-3) fixes glibc's mmap threshold at 1 MiB itself (`mallopt`): with glibc's moving "
        "threshold its resident memory grew to twice what it used. Other strategies keep glibc's "
        "default (fixed, it made a DDP step 60 % longer). Set, it is yours for every rank.",
        "foreign",
    ),
    EnvVar(
        "GLOO_SOCKET_IFNAME",
        "the user; else `launch/network.py` (multi-node)",
        "gloo",
        "Interface gloo advertises; rankwise picks the one that routes to the master unless set.",
        "foreign",
    ),
    EnvVar(
        "NCCL_SOCKET_IFNAME",
        "the user; else `launch/network.py` (multi-node)",
        "NCCL",
        "Interface NCCL uses; chosen like `GLOO_SOCKET_IFNAME`.",
        "foreign",
    ),
    EnvVar(
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        "`launch/torchrun.py` (c10d rendezvous), unless set",
        "torch.distributed.elastic",
        "`1`: torch would otherwise cache the first round's master address, and a node rejoining "
        "an elastic job later waits for it forever.",
        "foreign",
    ),
    EnvVar(
        "TORCH_DISTRIBUTED_DEBUG",
        "`rankwise train --set launch.check_collectives=true` (`train/run.py`)",
        "torch.distributed; `process.py`",
        "`DETAIL`: every collective's type and shapes are checked across ranks.",
        "foreign",
    ),
    EnvVar(
        "TOKENIZERS_PARALLELISM",
        "the `rankwise` command, unless set",
        "tokenizers",
        "`false`: no fork warning from HF tokenizers in worker processes.",
        "foreign",
    ),
    EnvVar(
        "ACCELERATE_USE_CPU",
        "`verify`, `bench --script` on a machine without a GPU (`compat/launchers.py`)",
        "Accelerate",
        "`True`: Accelerate's CPU mode; without it Accelerate joins no process group on a CPU. "
        "With `ACCELERATE_MIXED_PRECISION=no` and `ACCELERATE_DYNAMO_BACKEND=NO`: what "
        "`accelerate launch --cpu` sets.",
        "foreign",
    ),
    EnvVar(
        "LT_*",
        "`verify`, `bench --script` (`compat/launchers.py`)",
        "Lightning Fabric",
        "`LT_CLI_USED`, `LT_DEVICES`, `LT_NUM_NODES`, `LT_ACCELERATOR`, `LT_STRATEGY`: what "
        "`fabric run` hands `Fabric()` (without `LT_CLI_USED` it refuses several devices).",
        "foreign",
    ),
)


def registered(name: str) -> EnvVar | None:
    """The registry's entry for ``name``, or None."""
    return next((var for var in VARIABLES if var.name == name), None)
