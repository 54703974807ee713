"""``single``: one process, one device: the reference every other strategy is checked against."""

from __future__ import annotations

from rankwise.strategies import register
from rankwise.strategies.base import Strategy


@register
class SingleDevice(Strategy):
    name = "single"
    multiprocess = False
    description = "one process on one device (the reference run)"

    def setup_environment(self) -> None:
        pass

    @property
    def library_world_size(self) -> int:
        return 1
