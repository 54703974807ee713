"""The watcher's per-rank metrics, in one process standing for a rank of two."""

from __future__ import annotations

import builtins

import pytest
import torch

from rankwise.tools.watch import shard_metrics

pytestmark = pytest.mark.unit


def test_a_print_showing_the_unreduced_loss_is_counted_by_line_and_other_prints_are_not(
    monkeypatch, capsys
):
    monkeypatch.setattr(builtins, "print", builtins.print)  # (restored after the test)
    monkeypatch.setattr(shard_metrics, "rank_and_world", lambda: (0, 2))
    monkeypatch.setattr(shard_metrics, "outside_the_script", lambda filename: False)
    monkeypatch.setattr(shard_metrics, "call_site", lambda: "train.py:121")
    watch = shard_metrics.MetricWatch()
    watch.patch_frameworks()
    loss = torch.tensor(0.123456789)
    watch.loss_seen(loss)
    watch.read(loss, "train.py:121", loss.item())
    print(f"Train Epoch: 1 [0/60000]\tLoss: {loss.item():.6f}")
    print("Epoch 1 | Batchsize: 32 | Steps: 16")
    assert watch.records()["loss_prints"] == {"train.py:121": 1}
    # (a value the ranks reduced is the step's: its print is not counted)
    watch.loss_seen(loss)
    watch.collective((loss,))
    watch.read(loss, "train.py:121", loss.item())
    print(f"Loss: {loss.item():.6f}")
    assert watch.records()["loss_prints"] == {"train.py:121": 1}
    assert "Loss: 0.123457" in capsys.readouterr().out


def test_the_scan_for_metrics_built_earlier_passes_over_dead_weak_proxies(monkeypatch):
    """gc.get_objects() holds weakref proxies whose object is gone; isinstance on one raises."""
    import weakref

    torchmetrics = pytest.importorskip("torchmetrics")
    # (put back after the test: the watch replaces it)
    monkeypatch.setattr(torchmetrics.Metric, "__init__", torchmetrics.Metric.__init__)

    class Gone:
        pass

    gone = Gone()
    proxy = weakref.proxy(gone)
    del gone
    monkeypatch.setattr(builtins, "print", builtins.print)
    monkeypatch.setattr(shard_metrics.gc, "get_objects", lambda: [proxy])
    shard_metrics.MetricWatch().patch_frameworks()  # (no ReferenceError)
