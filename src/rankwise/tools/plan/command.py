"""``rankwise plan``: capture the script's step, plan every strategy and world size, write and print
the plan (and, with ``--validate``, check it against real runs here)."""

from __future__ import annotations

import json
import math
import time

from rankwise.errors import ConfigError
from rankwise.logs import get_logger
from rankwise.measure.memory import peak_rss_megabytes
from rankwise.tools.plan import comms, devices, report
from rankwise.tools.plan.capture import Capture, from_script
from rankwise.tools.plan.clipping import clipping_line
from rankwise.tools.plan.config import PlanConfig
from rankwise.tools.plan.failure import not_run
from rankwise.tools.plan.planner import Plan, Planner

log = get_logger(__name__)


def nodes_for(config: PlanConfig, device: devices.Device) -> dict[int, int]:
    """Nodes each world size spans: ``--nnodes``, or more where a node cannot hold that many
    devices."""
    return {
        world: max(config.nnodes, math.ceil(world / device.per_node))
        for world in config.world_sizes
    }


TRACEBACK = "plan-error.txt"
"""Where, under ``--out``, the traceback of a script the plan could not run goes."""


def capture_script(config: PlanConfig) -> Capture:
    log.info(
        f"rankwise plan: capturing {config.script}'s first training step (parameters fake) ..."
    )
    capture = from_script(config.script, config.script_args, config.out / TRACEBACK)
    capture.clips_at = clipping_line(config.script)
    return capture


def make_plan(config: PlanConfig, capture: Capture | None = None) -> Plan:
    """Capture (unless given), then plan (no output written)."""
    started = time.perf_counter()
    capture = capture or capture_script(config)
    device = devices.with_efficiency(
        devices.lookup(config.device, max(config.nproc_per_node)), config.efficiency
    )
    nodes = nodes_for(config, device)
    if config.comm is not None:
        bandwidth, measured_nodes = comms.from_comm_bench(config.comm)
        if measured_nodes == 1 and max(nodes.values()) > 1:
            bandwidth.notes.append(
                f"{config.comm} was measured inside one node; world sizes that span several nodes "
                "use it for the link between them too"
            )
    else:
        bandwidth = comms.from_device(device, max(nodes.values()))
    try:
        plan = Planner(config, capture, device, bandwidth, nodes).run()
    except ConfigError:
        raise
    except Exception as e:
        # (one line naming the script's line, not a traceback: rankwise.tools.plan.failure)
        raise not_run(
            config.script,
            e,
            "replay its training step on fake tensors (the step captured "
            + (f"at line {capture.line})" if capture.line else "in it)"),
            line=capture.line,
            traceback_file=config.out / TRACEBACK,
        ) from e
    plan.notes += bandwidth.notes
    plan.notes.append(
        f"the script clips the gradients' norm (line {capture.clips_at}): a sharded strategy "
        "all-reduces it"
        if capture.clips_at
        else "no clipping of the gradients' norm found in the script's text"
    )
    plan.elapsed_s, plan.peak_rss_mb = time.perf_counter() - started, peak_rss_megabytes()
    plan.notes.append(
        f"planned in {plan.elapsed_s:.1f} s; this process's peak resident memory "
        f"{plan.peak_rss_mb:,.0f} MB (the model's parameters were never allocated)"
    )
    return plan


def run(config: PlanConfig, *, as_json: bool = False) -> int:
    plan = make_plan(config)
    paths = report.write(plan, config.out)
    # The command's output (the table, the files): printed whatever the logging level.
    print(report.table(plan))
    print(f"\nwrote {', '.join(str(p) for p in paths)}")
    if as_json:
        print(json.dumps({"out": str(config.out), "fastest": report.as_json(plan)["fastest"]}))
    return 0
