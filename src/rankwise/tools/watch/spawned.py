"""An ``mp.spawn`` script, started the way it starts itself: one ``python script.py``, its spawned
children watched.

``rankwise verify`` runs such a script as one process, ``python -m rankwise.tools.watch.bootstrap
SCRIPT`` (:func:`launcher_main`).  There, before the script runs,
``torch.multiprocessing.start_processes`` is patched (``mp.spawn`` calls it) to hand each child
:class:`SpawnedRank` around the script's function: in the child it installs the watcher, arms the
stall deadline, runs ``fn(i, *args)``, and afterwards writes the rank's record and closes the
process group, as :mod:`rankwise.tools.watch.bootstrap` does for a rank torchrun started.  The
process that spawns has no model: it gets no watcher, and so writes no rank record that rank 0's
could be confused with.

What the script passes is recorded (``RUN_DIR/spawn.json``: ``nprocs``; each child's
``spawn-rank{i}.json``: what its ``init_process_group`` got, and where its port came from), for the
report; nothing in the script is changed.

The one-process reference (``WatchSettings.spawn == "one"``) runs the same command with
``nprocs=1``; in its child ``init_process_group`` takes ``rank=0, world_size=1`` (the rest as the
script passed it) and a ``DistributedSampler`` built with an explicit ``num_replicas`` takes
``num_replicas=1, rank=0`` while the group holds one process.  The watcher's reference machinery
then does the rest (each training loader takes N times its batch and the N ranks' samples).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import urlparse

import torch.distributed as dist
import torch.multiprocessing
from torch.utils.data import DistributedSampler

from rankwise.checkpoint import write_text_atomic
from rankwise.compat.watch_patches import checked
from rankwise.errors import ConfigError
from rankwise.launch.ports import port_in_use
from rankwise.launch.script import run_as_main
from rankwise.logs import to_terminal
from rankwise.tools.watch import stall
from rankwise.tools.watch.ranks import patch
from rankwise.tools.watch.settings import WatchSettings
from rankwise.tools.watch.watched_rank import arm_stall, watched
from rankwise.tools.watch.watcher import Watcher

SPAWN_RECORD, CHILD_RECORD = "spawn.json", "spawn-rank{index}.json"
ONE = "one"
"""``WatchSettings.spawn`` for the one-process reference (any other non-empty value: the
script's ranks)."""


class InitRecord(TypedDict):
    """What the script's ``init_process_group`` got in a spawned rank, and where its port came
    from."""

    backend: str
    init_method: str | None
    rank: int
    world_size: int | None
    port: int | None
    port_source: str
    """In words: ``from the environment``, ``set in the script``, ``in its init_method``, ..."""


class SamplerRecord(TypedDict):
    """A ``DistributedSampler`` the one-process reference built at one process (``num_replicas``,
    ``rank``: as the script passed them)."""

    num_replicas: int
    rank: int | None


class ChildRecord(TypedDict):
    """One spawned rank's ``spawn-rank{index}.json``."""

    index: int
    init: InitRecord | None
    """None: the rank never called ``init_process_group``."""
    samplers: list[SamplerRecord]


def launcher_main(argv: list[str], settings: WatchSettings) -> int:
    """The script's own process (it starts the ranks): the spawn patch, the script as
    ``__main__``."""
    arm_stall("launcher", settings)  # (paused once the ranks start: each has its own deadline)
    install_spawn_patch(settings)
    try:
        run_as_main(argv[0], argv[1:])
    finally:
        stall.disarm()
    return 0


def install_spawn_patch(settings: WatchSettings) -> None:
    """``torch.multiprocessing.start_processes`` wraps the script's function in
    :class:`SpawnedRank`: patched where ``mp.spawn`` looks it up (its own module's globals) and
    where a script calls it (the package)."""
    # (the package's `spawn` attribute is the function)
    module = sys.modules["torch.multiprocessing.spawn"]
    checked(module, "start_processes")
    checked(torch.multiprocessing, "start_processes")
    patched = _start_processes(module.start_processes, settings)
    # ignore[attr-defined]: mypy reads the module torch.multiprocessing.spawn as the function its
    # package exports
    module.start_processes = patched  # type: ignore[attr-defined]
    torch.multiprocessing.start_processes = patched


def _start_processes(original: Callable[..., Any], settings: WatchSettings) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def start_processes(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        asked = arguments["nprocs"]
        reference = settings.spawn == ONE
        if not reference and asked < 2:
            raise ConfigError(
                f"the script starts mp.spawn(nprocs={asked}): a distributed run needs at least 2 "
                "ranks (pass the script's own flag for its world size after --)"
            )
        arguments["nprocs"] = 1 if reference else asked
        arguments["fn"] = SpawnedRank(arguments["fn"], asked)
        write_text_atomic(
            settings.directory / SPAWN_RECORD,
            json.dumps(
                {
                    "nprocs": asked,
                    "started": arguments["nprocs"],
                    "start_method": arguments["start_method"],
                    "reference": reference,
                },
                indent=2,
            ),
        )
        stall.pause()  # this process only waits for its ranks now; each has its own deadline
        return original(*bound.args, **bound.kwargs)

    return start_processes


class SpawnedRank:
    """The script's ``fn`` as one of its spawned ranks runs it, watched (picklable: the spawn start
    method sends it to the child, the script's function by reference to the script, which the child
    runs again as ``__mp_main__``)."""

    def __init__(self, fn: Callable[..., object], nprocs: int) -> None:
        self.fn, self.nprocs = fn, nprocs

    def __call__(self, index: int, *args: Any) -> None:
        to_terminal()  # a rank of `verify`: rankwise's messages as under `rankwise launch`
        # (this child's: inherited from the process that spawned it)
        settings = WatchSettings.from_environment()
        arm_stall(f"rank{index}", settings)
        seen = InitSeen(index, one_process=settings.spawn == ONE)
        seen.install(self.fn)
        watcher = Watcher(settings)
        watcher.install()

        def ended() -> None:
            if not (dist.is_available() and dist.is_initialized()):
                # never joined a group: its record is still this rank's, not rank 0's
                watcher.calls.joined_alone(index)
            write_text_atomic(
                settings.directory / CHILD_RECORD.format(index=index),
                json.dumps(seen.record, indent=2),
            )

        watched(watcher, lambda: self.fn(index, *args), ended)


class InitSeen:
    """What the script's ``init_process_group`` got in a spawned rank (and the port's check); in the
    reference, the group and the script's samplers at one process."""

    def __init__(self, index: int, one_process: bool) -> None:
        self.index, self.one_process = index, one_process
        self.given_port = os.environ.get("MASTER_PORT")
        self.record: ChildRecord = {"index": index, "init": None, "samplers": []}

    def install(self, fn: Callable[..., object]) -> None:
        original = dist.init_process_group
        patch(dist, "init_process_group", self._init)
        # A script that imported the function itself (`from torch.distributed import
        # init_process_group`) holds the original: it ran its module-level code again in this child
        # before the patch.
        scope = getattr(fn, "__globals__", {})
        for name, value in list(scope.items()):
            if value is original:
                scope[name] = dist.init_process_group
        if self.one_process:
            patch(DistributedSampler, "__init__", self._sampler)

    def _init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)
        seen = self

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            arguments = bound.arguments
            rank = arguments.get("rank", -1)
            rank = int(os.environ.get("RANK", seen.index)) if rank is None or rank < 0 else rank
            world = arguments.get("world_size", -1)
            if world is None or world < 0:
                world = int(os.environ.get("WORLD_SIZE", 0)) or None
            port, source = seen._port(arguments.get("init_method"), arguments.get("store"))
            seen.record["init"] = {
                "backend": str(arguments.get("backend")),
                "init_method": arguments.get("init_method"),
                "rank": rank,
                "world_size": world,
                "port": port,
                "port_source": source,
            }
            if seen.one_process:
                # the one process is the whole group
                arguments["rank"], arguments["world_size"] = 0, 1
                rank = 0
            if rank == 0 and port is not None:
                check_port_free(port, source)
            return original(*bound.args, **bound.kwargs)

        return init_process_group

    def _port(self, init_method: str | None, store: object) -> tuple[int | None, str]:
        if store is not None:
            return None, "a store of the script's own"
        if init_method and not str(init_method).startswith("env://"):
            parsed = urlparse(str(init_method))
            return (
                (parsed.port, "in its init_method")
                if parsed.scheme == "tcp"
                else (None, f"{parsed.scheme}://")
            )
        port = os.environ.get("MASTER_PORT")
        if port is None:
            return None, "not set"
        return int(port), "from the environment" if port == self.given_port else "set in the script"

    def _sampler(self, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)
        seen = self

        def init(sampler: DistributedSampler[Any], *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(sampler, *args, **kwargs)
            arguments = bound.arguments
            alone = (
                not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1
            )
            replicas = arguments.get("num_replicas")
            if alone and replicas is not None and replicas > 1:
                # The script shards its data for the world size it passed; the one process takes
                # every sample.
                seen.record["samplers"].append(
                    {"num_replicas": replicas, "rank": arguments.get("rank")}
                )
                arguments["num_replicas"], arguments["rank"] = 1, 0
            return original(*bound.args, **bound.kwargs)

        return init


def check_port_free(port: int, source: str) -> None:
    """The port the script's rank 0 is about to listen on must be free: the script's own port is
    used as it is."""
    if port_in_use(port):
        raise ConfigError(
            f"port {port} ({source}) is in use: another process holds it (an earlier run of the "
            "script still going?); free it, or change the port the script uses"
        )


def read_records(run_dir: Path) -> dict[str, Any] | None:
    """What the script passed, from a run's records: ``spawn.json`` with each child's ``init``;
    ``None`` where the script never spawned."""
    path = Path(run_dir) / SPAWN_RECORD
    if not path.exists():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    children = [
        json.loads(p.read_text(encoding="utf-8"))
        for p in Path(run_dir).glob(CHILD_RECORD.format(index="*"))
    ]
    record["children"] = sorted(children, key=lambda child: child["index"])
    return record
