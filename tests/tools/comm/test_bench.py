"""`rankwise comm bench` on real gloo ranks and small sizes: consistent JSON, a PNG, a corrupted
result counted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rankwise.tools.comm import bench, ceilings, report, sizes
from tests.support.multiproc import run_ranks
from tests.support.tools.comm.patching import corrupting, replaced

SIZES = [4, 8, 64, 4096]


def _sweep(ops: list[str], corrupt: str | None = None) -> dict:
    """One rank: the bench's sweep; ``corrupt`` breaks that torch function's float results on rank
    1."""
    from rankwise.process import destroy_process_group
    from rankwise.tools.harness import join

    env, device = join(0, "gloo", 60)
    try:
        with replaced(corrupt, corrupting(rank=1, index=-1)):
            settings = bench.Settings(
                ops,
                SIZES,
                "float32",
                iters=3,
                warmup=1,
                backend="gloo",
                timeout_s=60,
                progress=False,
            )
            measured = bench.sweep(settings, device)
        return {**measured, "nnodes": 1, "settings": settings.__dict__}
    finally:
        destroy_process_group()


@pytest.mark.multiproc
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_operation_is_measured_correct_and_consistent(world_size, tmp_path):
    measured = run_ranks(_sweep, world_size, list(bench.OPS), timeout=120)[0]
    result = {
        **measured,
        "ceilings": {
            "tcp_loopback_GBps": 4.0,
            "tcp_loopback_bidirectional_GBps": 2.0,
            "memcpy_1thread_GBps": 6.0,
        },
        "machine": {"torch": "x", "cpu": "test", "cores": 2},
    }
    result["analysis"] = report.analyse(result)
    paths = report.write(result, tmp_path)
    written = json.loads(paths[0].read_text())
    rows = written["results"]
    n = world_size
    assert [(r["op"], r["bytes"]) for r in rows][: len(SIZES)] == [
        ("all_reduce", size) for size in SIZES
    ]
    assert list(dict.fromkeys(r["op"] for r in rows)) == list(bench.OPS)
    # Sizes that round to the same element count are measured once (on 3 ranks all_gather's 4 and 8
    # B are 12 B).
    assert len(rows) == sum(
        len({sizes.elements(op, size, n, 4) for size in SIZES}) for op in bench.OPS
    )
    assert len({(r["op"], r["bytes"]) for r in rows}) == len(rows)
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
    }
    for row in rows:
        assert row["wrong"] == 0, row
        assert row["factor"] == pytest.approx(factors[row["op"]])
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * factors[row["op"]])
        assert row["algbw_GBps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9)
        assert row["p90_us"] >= row["time_us"] > 0
        assert row["bytes"] == row["count"] * 4
        if row["op"] in sizes.SPLIT_OPS:
            assert row["count"] % n == 0
    assert (
        written["harness"]["bare_us"] > 0
        and len(written["harness"]["ratios"]) == bench.OVERHEAD_ROUNDS
    )
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths[2].stat().st_size > 10_000
    assert "| 4 KiB |" in paths[1].read_text()


@pytest.mark.multiproc
def test_a_corrupted_result_is_counted_wrong():
    rows = run_ranks(_sweep, 2, ["all_reduce", "broadcast"], "all_reduce", timeout=60)[0]["results"]
    wrong = {(r["op"], r["bytes"]): r["wrong"] for r in rows}
    # rank 1's last element, each size
    assert all(wrong[("all_reduce", size)] == 1 for size in SIZES), wrong
    assert all(wrong[("broadcast", size)] == 0 for size in SIZES), wrong


def test_sizes_and_elements():
    assert (
        sizes.parse_size("256M") == 256 * 2**20
        and sizes.parse_size("4") == 4
        and sizes.parse_size("1KiB") == 1024
    )
    with pytest.raises(Exception, match="not a size"):
        sizes.parse_size("lots")
    assert sizes.sizes_between(4, 64) == [4, 8, 16, 32, 64]
    assert sizes.elements("all_reduce", 4, 3, 4) == 1
    assert sizes.elements("all_gather", 4, 3, 4) == 3  # at least one element per rank
    assert sizes.elements("all_gather", 4096, 3, 4) == 1023


def test_bucket_advice_finds_the_knee():
    def curve(points):
        return [{"op": "all_reduce", "bytes": b * 2**20, "busbw_GBps": bw} for b, bw in points]

    late = report.bucket_advice(curve([(1, 0.2), (4, 0.5), (16, 0.7), (32, 0.85), (64, 1.0)]))
    assert late["suggested_bucket_cap_mb"] == 64
    assert "reaches only 70% of peak: bucket_cap_mb=64 would help" in late["text"]
    early = report.bucket_advice(curve([(1, 0.5), (4, 0.95), (16, 1.0), (32, 0.98)]))
    assert early["suggested_bucket_cap_mb"] == 4 and "the default is fine" in early["text"]
    short = report.bucket_advice(curve([(1, 0.5), (4, 1.0)]))
    assert "too few to judge" in short["text"]


@pytest.mark.multiproc  # the loopback ceiling starts a process to receive
def test_the_loopback_and_memcpy_ceilings_are_measured():
    assert ceilings.tcp_loopback_GBps(False, total=16 * 2**20) > 0.01
    assert ceilings.tcp_loopback_GBps(True, total=16 * 2**20) > 0.01
    assert ceilings.memcpy_GBps(2**20) > 0.1


@pytest.mark.multiproc
def test_the_command_writes_its_outputs_and_refuses_bad_flags(tmp_path):
    out = tmp_path / "comm"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "comm",
            "bench",
            "--ops",
            "all_reduce,all_to_all",
            "--max-bytes",
            "1K",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--no-ceilings",
            "--no-progress",
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "# all_to_all" in done.stdout and "busbw(GB/s)" in done.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["wrong"] == 0 and set(summary["ops"]) == {"all_reduce", "all_to_all"}
    assert {p.name for p in out.iterdir()} == {"comm.json", "comm.md", "comm.png"}
    bad = subprocess.run(
        [sys.executable, "-m", "rankwise.cli", "comm", "bench", "--ops", "allreduce"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown operation(s) allreduce" in bad.stderr
