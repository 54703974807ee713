"""An mp.spawn script's ranks: the parts that need no process (the whole run:
test_verify_scripts.py)."""

from __future__ import annotations

import socket

import pytest

from rankwise.errors import ConfigError
from rankwise.tools.watch.spawned import check_port_free


def test_a_port_the_script_sets_that_another_process_holds_is_named():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"port {port} \(set in the script\) is in use"):
            check_port_free(port, "set in the script")
    check_port_free(port, "set in the script")  # free again
