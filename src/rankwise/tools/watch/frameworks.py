"""Which framework a script trains with, and how that framework's own launcher would start it here.

Detected from the script's imports (``--framework`` overrides):

* ``rankwise``: a script on ``rankwise.setup()`` — ``rankwise launch --strategy``
  (:func:`rankwise_framework`);
* ``accelerate``: as ``accelerate launch`` would on this machine: torchrun's environment, and on a
  machine without a GPU its CPU mode (``ACCELERATE_USE_CPU=true``, what ``accelerate launch --cpu``
  sets), without which Accelerate joins no process group and every process trains alone on all the
  data;
* ``trainer`` (Hugging Face ``Trainer``, built on Accelerate): as torchrun, with Accelerate's CPU
  mode where there is no GPU;
* ``fabric`` (Lightning Fabric): as ``fabric run --devices N`` would: torchrun's environment and the
  ``LT_*`` settings ``fabric run`` hands ``Fabric()`` (the CPU accelerator where there is no GPU);
* ``lightning`` (a Lightning ``Trainer``): as torchrun, as Lightning's documentation starts a
  Trainer script with ``devices=N``; its one-process reference has the Trainer on one device
  (:mod:`rankwise.tools.watch.lightning`);
* ``spawn``: a script that starts its own ranks with ``mp.spawn`` (``torch.multiprocessing.spawn``
  or ``start_processes``) whenever it runs, not only behind a flag (:func:`spawns_unconditionally`),
  as in the source documents — as ``python script.py`` starts itself, its
  spawned children watched (:mod:`rankwise.tools.watch.spawned`): under torchrun every rank would
  spawn ranks of its own;
* ``deepspeed``: a DeepSpeed-engine script (``deepspeed.initialize``, ``engine.step()``) — as
  torchrun (DeepSpeed reads its variables); each step at ``engine.step()``
  (:mod:`rankwise.tools.watch.deepspeed_engine`);
* ``horovod``: ``hvd.init()`` and ``hvd.DistributedOptimizer`` — as ``horovodrun --gloo``; each step
  at the wrapped optimizer's ``step``, on the gradients Horovod averaged
  (:mod:`rankwise.tools.watch.horovod_optimizer`);
* ``torch``: plain ``torch.distributed`` — as torchrun.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from rankwise.compat.launchers import accelerate_launch_cpu, fabric_run
from rankwise.errors import ConfigError
from rankwise.tools.watch.deepspeed_engine import ENVIRONMENT as DEEPSPEED
from rankwise.tools.watch.horovod_optimizer import ENVIRONMENT as HOROVOD
from rankwise.tools.watch.lightning import ENVIRONMENT as LIGHTNING

FRAMEWORKS = (
    "auto",
    "rankwise",
    "torch",
    "spawn",
    "accelerate",
    "trainer",
    "fabric",
    "lightning",
    "deepspeed",
    "horovod",
)


@dataclass(frozen=True)
class Framework:
    name: str
    launch: str
    """How its launcher would start the script, in words (for the report)."""
    environment: dict[str, str] = field(default_factory=dict)
    strategy: str = "as written"
    """The strategy the script runs on several processes here, in words."""
    note: str | None = None
    """What this machine rules out for the framework (a bench row cannot be made for it)."""
    choice: str | None = None
    """The strategy asked of the framework's launcher (``bench --strategies``); ``None``: the
    script's default."""
    unavailable: str | None = None
    """Why that strategy cannot run here (the row says so instead of running)."""
    launch_flags: tuple[str, ...] = ()
    """``rankwise launch``'s flags for the script (a script on ``rankwise.setup()``: its
    strategy's)."""

    @property
    def label(self) -> str:
        return f"{self.name} {self.choice}" if self.choice else self.name

    def strategy_at(self, processes: int) -> str:
        return "one process" if processes == 1 else self.strategy

    def with_strategy(self, name: str) -> Framework:
        """The framework started with its launcher's strategy setting ``name``, as ``fabric run
        --strategy NAME`` or ``accelerate launch --use_fsdp`` would: the script is not edited.
        ``ConfigError`` for a framework that chooses its strategy in code, or a name its launcher
        does not take."""
        if self.name == "fabric":
            names = fabric_strategies()
            if name not in names:
                raise ConfigError(
                    f"--strategies {name}: not a strategy `fabric run --strategy` takes here; one "
                    f"of {', '.join(names)}"
                )
            return replace(
                self,
                environment={**self.environment, "LT_STRATEGY": name},
                choice=name,
                strategy=f"Fabric's {name}",
            )
        if self.name == "accelerate":
            if name not in ACCELERATE_STRATEGIES:
                raise ConfigError(
                    f"--strategies {name}: `accelerate launch` switches between "
                    f"{', '.join(ACCELERATE_STRATEGIES)}"
                )
            gpu = torch.cuda.is_available()
            why = None
            if name != "ddp" and not gpu:
                why = self.note
            elif name == "deepspeed":
                why = (
                    "the DeepSpeed engine steps its own flattened, partitioned fp32 copy of the "
                    "weights, which the watcher's optimizer hooks cannot name parameter by "
                    "parameter"
                )
            return replace(
                self,
                environment={**self.environment, **ACCELERATE_STRATEGIES[name]},
                choice=name,
                strategy=f"Accelerate's {name}" + ("" if gpu else " (CPU)"),
                unavailable=why,
            )
        if self.name == "horovod":
            raise ConfigError(
                "--strategies: a Horovod script has one strategy, Horovod's allreduce in its "
                "DistributedOptimizer; its rows are world sizes (--nproc-per-node 1,2)"
            )
        # (DeepSpeed has no launcher setting for it: `deepspeed` passes no config)
        if self.name == "deepspeed":
            raise ConfigError(
                "--strategies: a DeepSpeed script's ZeRO stage is in the config it gives "
                "deepspeed.initialize, which no launcher setting changes; its rows are world "
                "sizes (--nproc-per-node 1,2). For a row per stage, let the script read its "
                "config from a file named by an argument and run one bench per file (-- "
                "--deepspeed_config z1.json)"
            )
        raise ConfigError(
            f"--strategies: a {self.name} script chooses its strategy in its own code; its rows "
            "are world sizes (--nproc-per-node 1,2)"
        )

    def environment_for(self, processes: int) -> dict[str, str]:
        """What its launcher sets for ``processes`` ranks on this node (besides torchrun's own
        variables)."""
        if self.name == "fabric":  # what `fabric run --devices N` hands the script's Fabric(...)
            return {**self.environment, **fabric_run(processes)}
        return dict(self.environment)


ACCELERATE_STRATEGIES = {
    "ddp": {},
    # `accelerate launch --use_fsdp --fsdp_version 2`
    "fsdp": {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"},
    "deepspeed": {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"},
}
"""What ``accelerate launch`` sets for each of its strategies (its FSDP as FSDP2: parameters the
watcher gathers)."""


def fabric_strategies() -> list[str]:
    """The strategies ``fabric run --strategy`` takes: Fabric's registry without the ones that start
    processes themselves (spawn, fork, notebook) or need TPUs."""
    try:
        from lightning_fabric.strategies import STRATEGY_REGISTRY
    except ImportError:
        try:
            # ignore[assignment]: the same registry under the lightning package's name for
            # lightning_fabric
            from lightning.fabric.strategies import STRATEGY_REGISTRY  # type: ignore[assignment]
        except ImportError:
            return ["ddp", "fsdp", "deepspeed", "dp"]
    return [
        name
        for name in STRATEGY_REGISTRY.available_strategies()
        if not re.search(r"spawn|fork|notebook|xla|tpu", name)
    ]


def _imports(text: str, *modules: str) -> bool:
    names = "|".join(re.escape(m) for m in modules)
    return (
        re.search(rf"^\s*(from\s+({names})(\.|\s)|import\s+({names})(\.|\s|$|,))", text, re.M)
        is not None
    )


SPAWNS = re.compile(
    r"\b(?:mp|multiprocessing)\.(?:spawn|start_processes)\s*\(|\bstart_processes\s*\("
    r"|^\s*from\s+torch\.multiprocessing(?:\.spawn)?\s+import\s[^#\n]*\bspawn\b",
    re.M,
)
"""A script that starts its own ranks: ``mp.spawn(``, ``torch.multiprocessing.spawn(``,
``start_processes(``."""


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"``."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
    )


def spawns_unconditionally(text: str) -> bool:
    """Whether the script starts its own ranks whenever it runs: some ``mp.spawn`` /
    ``start_processes`` call outside any ``if`` (other than ``if __name__ == "__main__"``).  A
    script whose every such call sits behind a flag (ImageNet's ``if
    args.multiprocessing_distributed: mp.spawn(...) else: main_worker(...)``) has another way in:
    its documentation starts it with torchrun, so it is a torchrun script.  Unparsable text: the
    call is taken at its word."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return True
    found: list[bool] = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Call):
            callee = node.func
            name = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
            if name in ("spawn", "start_processes"):
                found.append(guarded)
        for child in ast.iter_child_nodes(node):
            behind = guarded or (
                isinstance(node, ast.If)
                and not _is_main_guard(node.test)
                and child is not node.test
            )
            visit(child, behind)

    visit(tree, False)
    return not found or not all(found)


def detect(script: Path) -> str:
    text = script.read_text(encoding="utf-8", errors="replace")
    if _imports(text, "horovod", "horovod.torch") and not _imports(text, "rankwise"):
        return "horovod"
    if "deepspeed.initialize" in text and not _imports(
        text, "rankwise", "accelerate", "lightning", "transformers"
    ):
        return "deepspeed"
    if _imports(text, "rankwise"):
        return "rankwise"  # (rankwise.spawn too: the Runtime's own launcher)
    if SPAWNS.search(text) and spawns_unconditionally(text):
        return "spawn"
    # (a Lightning script may import transformers for its model: Lightning's Trainer first)
    if re.search(r"\bTrainer\s*\(", text) and _imports(
        text, "lightning", "lightning.pytorch", "pytorch_lightning"
    ):
        return "lightning"
    if re.search(r"\bTrainer\s*\(", text) and _imports(text, "transformers"):
        return "trainer"
    if _imports(text, "lightning", "lightning.fabric", "lightning_fabric"):
        return "fabric"
    if _imports(text, "accelerate"):
        return "accelerate"
    return "torch"


def rankwise_framework(
    strategy: str, precision: str | None = None, settings: tuple[str, ...] = ()
) -> Framework:
    """A script on ``rankwise.setup()``, started as ``rankwise launch --strategy STRATEGY`` starts
    it."""
    flags = (
        "--strategy",
        strategy,
        *(("--precision", precision) if precision else ()),
        *(f"--set={setting}" for setting in settings),
    )
    return Framework(
        "rankwise",
        f"as `rankwise launch --strategy {strategy}` starts it",
        strategy=strategy,
        launch_flags=flags,
    )


def framework(name: str) -> Framework:
    gpu = torch.cuda.is_available()
    cpu = {} if gpu else accelerate_launch_cpu()
    where = "" if gpu else " in its CPU mode (ACCELERATE_USE_CPU=true: no GPU here)"
    only_ddp = (
        None
        if gpu
        else (
            "without a GPU Accelerate runs DDP only (its FSDP and DeepSpeed settings are ignored "
            "in its CPU mode), so this machine has no row for them"
        )
    )
    return {
        "torch": Framework(
            "torch", "as torchrun would start it", strategy="the script's own (as written)"
        ),
        "spawn": Framework(
            "spawn",
            "as `python script.py` starts itself: its mp.spawn children are the ranks",
            strategy="the script's own (as written)",
        ),
        "accelerate": Framework(
            "accelerate",
            f"as `accelerate launch` would start it{where}",
            cpu,
            strategy="Accelerate's configured one" if gpu else "DDP (Accelerate, CPU)",
            note=only_ddp,
        ),
        "trainer": Framework(
            "trainer",
            f"as torchrun would start it, Accelerate{where}",
            cpu,
            strategy="Trainer's (DDP by default)" if gpu else "DDP (Trainer on Accelerate, CPU)",
            note=only_ddp,
        ),
        "fabric": Framework(
            "fabric",
            "as `fabric run --devices N` would start it",
            {} if gpu else {"LT_ACCELERATOR": "cpu"},
            strategy="Fabric's (DDP for several devices)",
        ),
        "deepspeed": Framework(
            "deepspeed",
            "as torchrun would start it (deepspeed.init_distributed reads torchrun's variables, "
            "as under the deepspeed launcher)",
            {DEEPSPEED: "1"},
            strategy="the script's DeepSpeed config (as written)",
        ),
        "horovod": Framework(
            "horovod",
            "as `horovodrun -np N -H localhost:N --gloo` would start it (one process: `python "
            "script.py`, as Horovod runs alone)",
            {HOROVOD: "1"},
            strategy="Horovod's DistributedOptimizer (as written)",
        ),
        "lightning": Framework(
            "lightning",
            "as torchrun would start it (Lightning's documentation: Trainer(devices=N) under "
            "torchrun); the one process has the Trainer on one device",
            {LIGHTNING: "1"},
            strategy="the Trainer's (as written)",
        ),
    }[name]


def framework_world_size() -> int | None:
    """The process count Accelerate settled on, where the script used it (it can settle on 1 in a
    torchrun job)."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None) or {}
    return shared.get("num_processes")
