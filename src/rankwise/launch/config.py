"""Where a job's processes run and how they start: one validated object every launcher reads."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Launcher = Literal["torchrun", "spawn", "horovodrun"]
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
"""How worker processes start (``launch.launcher``)."""


class LaunchConfig(BaseModel):
    """Where a job's processes run and how they start: the `launch` section of a run
    configuration."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True
    )

    launcher: Launcher = "torchrun"
    """How worker processes start: torchrun's elastic agent in-process, torch.multiprocessing spawn,
    or horovodrun (chosen for the horovod strategy)."""
    nproc_per_node: int = Field(1, ge=1)
    """Processes on this node (usually one per GPU)."""
    nnodes: int | str = 1
    """Number of nodes (machines), or MIN:MAX for an elastic job (needs rdzv_backend, e.g. c10d):
    training starts once MIN nodes joined, the world size is settled at the rendezvous."""
    node_rank: int = Field(0, ge=0)
    """Rank of this node, 0 .. nnodes-1."""
    master_addr: str = "127.0.0.1"
    """Address of the rank-0 node."""
    master_port: int | None = Field(None, ge=1, le=65535)
    """Port on the rank-0 node; a free one is picked on a single node when not set."""
    rdzv_backend: str | None = None
    """torchrun rendezvous backend (e.g. c10d); overrides master_addr/port when set."""
    rdzv_endpoint: str | None = None
    """torchrun rendezvous endpoint host:port."""
    rdzv_id: str | None = None
    """torchrun rendezvous id shared by all nodes of the job."""
    rdzv_last_call_s: int = Field(30, ge=1)
    """Elastic jobs: how long the rendezvous waits for more nodes once MIN have joined (c10d's
    last_call_timeout), at the start and at every restart after a node is lost."""
    max_restarts: int = Field(0, ge=0)
    """How often torchrun restarts the worker group after a failure."""
    timeout_s: float = Field(300.0, gt=0)
    """Timeout of collective operations and process-group set-up, and how long the nodes of a
    multi-node job wait for each other at the rendezvous, in seconds."""
    check_collectives: bool = False
    """Check before every collective that all ranks call the same one with the same shapes
    (TORCH_DISTRIBUTED_DEBUG=DETAIL): a mismatch is an error naming both sides instead of a hang;
    costs an extra exchange per collective, for debugging."""

    @field_validator("nnodes", mode="before")
    @classmethod
    def _node_count_or_range(cls, value: Any) -> int | str:
        low, _, high = str(value).partition(":")
        if not (low.isdigit() and (high or low).isdigit()) or not 1 <= int(low) <= int(high or low):
            raise ValueError(
                "nnodes must be a number >= 1 or a range MIN:MAX with 1 <= MIN <= MAX, got "
                f"{value!r}"
            )
        return int(low) if not high or high == low else f"{int(low)}:{int(high)}"

    @model_validator(mode="after")
    def _elastic_needs_rendezvous(self) -> LaunchConfig:
        if isinstance(self.nnodes, str) and not self.rdzv_backend:
            raise ValueError(
                f"launch.nnodes={self.nnodes} (a range) needs torchrun's rendezvous: "
                "--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB"
            )
        return self

    @property
    def node_range(self) -> tuple[int, int]:
        """Fewest and most nodes of the job (equal unless ``nnodes`` is a range)."""
        low, _, high = str(self.nnodes).partition(":")
        return int(low), int(high or low)

    @property
    def multi_node(self) -> bool:
        """Whether the job can span more than one node."""
        return self.node_range[1] > 1
