"""The devices a plan is for: memory, peak FLOP/s, memory and link bandwidths, from datasheets or
measured here.

GPUs from their datasheets (NVIDIA's H100/H200/A100/L40S/L4/V100 product pages and their NVLink and
InfiniBand generations; the peak FLOP/s are :data:`rankwise.measure.flops.DATASHEET_TFLOPS`, dense,
no sparsity).  Link bandwidths are per GPU and one direction; a collective's bus bandwidth reaches
:data:`LINK_EFFICIENCY` of it (nccl-tests on 8 x H100 SXM report all_reduce busbw of about 370-480
GB/s on 450 GB/s NVLink 4).  Across nodes every GPU has its own network adapter (the NDR/HDR "rail"
designs of DGX/HGX systems).  ``cpu`` is this machine, measured: its memory (``MemTotal``), its
matrix-product peak (:func:`rankwise.measure.flops.matmul_peak` with the threads a rank gets), one
thread's memory copy bandwidth, and gloo between local processes at 1 GB/s unless ``rankwise comm
bench`` measured otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from rankwise.errors import ConfigError
from rankwise.measure.flops import DATASHEET_TFLOPS

GiB = 2**30
LINK_EFFICIENCY = 0.8
"""The share of a link's bandwidth a large collective's bus bandwidth reaches."""
GPU_EFFICIENCY = 0.4
"""Model FLOPs utilisation assumed on a GPU: the step's FLOPs over the datasheet peak.  Llama 3's
pre-training reports 38-43 % of the BF16 peak on H100s (Dubey et al. 2024, table 4); smaller models
and fp32 reach less."""


@dataclass(frozen=True)
class Device:
    name: str
    """What ``--device`` names."""
    memory_bytes: int
    """Memory per device."""
    peak_fp32: float
    """Peak FLOP/s at fp32 (no TF32)."""
    peak_16: float
    """Peak FLOP/s at bf16/fp16 (tensor cores)."""
    memory_bandwidth: float
    """Bytes/s between the device and its memory."""
    intra_node: float
    """Bytes/s one way per device to the others of its node (NVLink, or PCIe), before
    :data:`LINK_EFFICIENCY`."""
    inter_node: float
    """Bytes/s one way per device across nodes (its network adapter), before
    :data:`LINK_EFFICIENCY`."""
    per_node: int
    """Devices in one node (a larger ``--nproc-per-node`` spans several)."""
    latency_s: float
    """Time of a collective of a few bytes between two devices (the alpha of the bandwidth
    model)."""
    overlaps: bool = True
    """Whether communication runs beside computation (a GPU's copy engines and streams; a CPU only
    on free cores)."""
    efficiency: float = GPU_EFFICIENCY
    """The share of the peak a training step's FLOPs are assumed to run at."""
    source: str = "datasheet"
    """Where the numbers come from."""

    def peak(self, half: bool) -> float:
        return self.peak_16 if half else self.peak_fp32


def _gpu(
    name: str,
    sheet: str,
    memory_gib: float,
    hbm_TBps: float,
    link_GBps: float,
    network_Gbps: float,
    per_node: int = 8,
) -> Device:
    peaks = DATASHEET_TFLOPS[sheet]
    return Device(
        name,
        int(memory_gib * GiB),
        peaks["fp32"] * 1e12,
        peaks["16"] * 1e12,
        hbm_TBps * 1e12,
        link_GBps * 1e9,
        network_Gbps / 8 * 1e9,
        per_node,
        latency_s=10e-6,
        source=f"datasheet ({sheet})",
    )


GPUS = {
    # SXM5, NVLink 4 (900 GB/s both ways), NDR 400 Gb/s
    "h100": _gpu("h100", "H100", 80, 3.35, 450, 400),
    "h200": _gpu("h200", "H200", 141, 4.8, 450, 400),
    "a100": _gpu("a100", "A100", 80, 2.04, 300, 200),  # SXM4 80GB, NVLink 3, HDR 200 Gb/s
    "a100-40gb": _gpu("a100-40gb", "A100", 40, 1.56, 300, 200),
    "l40s": _gpu("l40s", "L40S", 48, 0.864, 32, 200),  # PCIe 4.0 x16, no NVLink
    "l4": _gpu("l4", "L4", 24, 0.3, 32, 100),
    "v100": _gpu("v100", "V100", 32, 0.9, 150, 100),  # SXM2, NVLink 2, EDR 100 Gb/s
}
GLOO_LOCAL_GBps = 1.0
"""gloo all_reduce between two local processes, fp32, large messages: about 1.0-1.1 GB/s on the
development machines (docs/measurements.md); ``rankwise comm bench`` measures it on yours."""


def names() -> list[str]:
    return [*GPUS, "cpu"]


def this_cpu(ranks_per_node: int) -> Device:
    """This machine as the device, measured with the threads each of ``ranks_per_node`` ranks
    gets."""
    from rankwise.measure.flops import matmul_peak
    from rankwise.process import usable_cores
    from rankwise.tools.comm.ceilings import memcpy_GBps

    threads = max(1, usable_cores() // max(1, ranks_per_node))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fp32 = matmul_peak(torch.device("cpu"), torch.float32)
        bf16 = matmul_peak(torch.device("cpu"), torch.bfloat16)
    finally:
        torch.set_num_threads(before)
    return Device(
        "cpu",
        _memory_total(),
        fp32,
        bf16,
        memcpy_GBps() * 1e9,
        GLOO_LOCAL_GBps * 1e9,
        GLOO_LOCAL_GBps * 1e9,
        per_node=10**6,
        latency_s=100e-6,
        overlaps=usable_cores() > ranks_per_node * threads,
        efficiency=0.5,
        source=f"measured here ({threads} thread(s) a rank); gloo at {GLOO_LOCAL_GBps:g} GB/s",
    )


def _memory_total() -> int:
    with open("/proc/meminfo", encoding="ascii") as info:
        for line in info:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def present() -> str:
    """The device this machine has: its GPU where torch sees a known one, else the CPU."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0).lower()
        for key in sorted(GPUS, key=len, reverse=True):
            if key.split("-")[0] in name.replace(" ", ""):
                return key
    return "cpu"


def lookup(name: str | None, ranks_per_node: int) -> Device:
    """The device ``--device`` names (``None``: the one present)."""
    name = (name or present()).lower()
    if name == "cpu":
        return this_cpu(ranks_per_node)
    if name not in GPUS:
        raise ConfigError(f"--device {name!r}: choose one of {', '.join(names())}")
    return GPUS[name]


def with_efficiency(device: Device, efficiency: float | None) -> Device:
    return device if efficiency is None else replace(device, efficiency=efficiency)
