"""What the frameworks' own launchers hand a script, so rankwise starts it the same way.

A script written for ``fabric run`` or ``accelerate launch`` reads its launcher's environment:
without ``LT_CLI_USED=1`` Fabric refuses more than one device ("you must call `.launch()` or use the
CLI"), and without ``ACCELERATE_USE_CPU`` an Accelerate script on a machine without a GPU joins no
process group.  These variables are not a public API of either library: each record says where the
library sets them and the releases on which the set was observed, and
``tests/compat/test_launchers.py`` runs the real launcher and compares what the script sees with the
record, so a release that changes them fails a test instead of a user's run.

Both launchers put torchrun's own variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...) beside
these; rankwise's launcher sets those itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rankwise.compat.versions import installed, series, warn_once


@dataclass(frozen=True)
class LauncherEnvironment:
    """The variables one launcher sets for the processes it starts."""

    launcher: str
    """The command, as a user types it."""
    library: str
    """The distribution the launcher belongs to."""
    source: str
    """Where the library sets them."""
    environment: dict[str, str] = field(default_factory=dict)
    """What it sets whatever its flags (values as it writes them)."""
    seen_on: tuple[str, ...] = ()
    """Release series (``major.minor``) on which the set was observed."""

    def check(self) -> None:
        """One warning per process on a release series the set was not observed on (the test says
        whether it still holds)."""
        version = installed(self.library)
        if version is not None and series(version) not in self.seen_on:
            warn_once(
                self.launcher,
                f"rankwise starts {self.library} scripts with the environment `{self.launcher}` "
                f"sets, observed on {', '.join(self.seen_on)}; {self.library} {version} may set "
                "others: run tests/compat/test_launchers.py",
            )


FABRIC_RUN = LauncherEnvironment(
    "fabric run",
    "lightning",
    "lightning_fabric/cli.py, _set_env_variables: read back by Fabric's _Connector",
    # (the CLI's mark: Fabric(devices>1) outside it raises unless .launch() is called)
    {"LT_CLI_USED": "1", "LT_NUM_NODES": "1"},
    seen_on=("2.6",),
)
"""``fabric run --accelerator A --devices N [--strategy S]``: ``LT_ACCELERATOR``, ``LT_DEVICES``
and ``LT_STRATEGY`` from its flags (:func:`fabric_run`)."""

ACCELERATE_LAUNCH_CPU = LauncherEnvironment(
    "accelerate launch --cpu",
    "accelerate",
    "accelerate/utils/launch.py, prepare_simple_launcher_cmd_env: read back by AcceleratorState",
    {
        "ACCELERATE_USE_CPU": "True",
        "ACCELERATE_MIXED_PRECISION": "no",
        "ACCELERATE_DYNAMO_BACKEND": "NO",
    },
    seen_on=("1.15",),
)
"""``accelerate launch --cpu`` without a config file: its CPU mode, no mixed precision, no
compile.  (On a machine without a GPU ``accelerate launch --num_processes 2`` still starts one
process: rankwise starts the ranks as torchrun does, each with this environment.)"""


def fabric_run(devices: int, accelerator: str | None = None) -> dict[str, str]:
    """What ``fabric run --devices N`` (``--accelerator A``) hands each process's ``Fabric()``."""
    FABRIC_RUN.check()
    return {
        **FABRIC_RUN.environment,
        "LT_DEVICES": str(devices),
        **({"LT_ACCELERATOR": accelerator} if accelerator else {}),
    }


def accelerate_launch_cpu() -> dict[str, str]:
    """What ``accelerate launch --cpu`` hands each process."""
    ACCELERATE_LAUNCH_CPU.check()
    return dict(ACCELERATE_LAUNCH_CPU.environment)
