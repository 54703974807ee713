"""How processes start.  Strategies never start processes; launchers never know strategies.

* :mod:`rankwise.launch.torchrun` — torchrun's elastic agent, called in-process.
* :mod:`rankwise.launch.spawn` — ``torch.multiprocessing`` spawn (the ``mp.spawn`` style).
* :mod:`rankwise.launch.worker` — what each rank of ``rankwise train`` runs.
"""

from rankwise.launch.errors import LaunchError, Stopped
from rankwise.launch.ports import free_port
from rankwise.launch.spawn import spawn

__all__ = ["LaunchError", "Stopped", "free_port", "spawn"]
