"""rankwise plan's accounting against closed-form counts, on small models built with fake
parameters."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rankwise.tools.plan import rank_memory
from rankwise.tools.plan.capture import from_factory
from rankwise.tools.plan.comms import Bandwidth, collectives
from rankwise.tools.plan.fake import is_fake
from rankwise.tools.plan.fake_step import trace
from rankwise.tools.plan.fsdp_fake_ranks import fsdp
from rankwise.tools.plan.rank_memory import KINDS, Setting, zero_partition
from tests.support.tools.plan.accounting_model import LAYERS, ROWS, WIDTH, Net, build


@pytest.fixture(scope="module")
def capture():
    return from_factory(build, (torch.randn(ROWS, WIDTH),))


@pytest.fixture(scope="module")
def fp32(capture):
    return trace(capture, ROWS)


def phi() -> int:
    return sum(p.numel() for p in Net().parameters())


def test_the_capture_has_fake_parameters_and_a_real_batch(capture):
    assert all(is_fake(p) for p in capture.model.parameters())
    assert not is_fake(capture.args[0]) and capture.rows == ROWS


def test_a_billion_parameters_build_without_memory():
    from rankwise.measure.memory import peak_rss_megabytes

    before = peak_rss_megabytes()
    # 1.07e9 parameters
    big = from_factory(lambda: (nn.Linear(32768, 32768), None), (torch.randn(1, 32768),))
    assert sum(p.numel() for p in big.model.parameters()) > 1e9
    assert peak_rss_megabytes() - before < 200  # its 4.3 GB of fp32 were never touched


def test_the_trace_counts_model_states_exactly(fp32):
    n = phi()
    assert fp32.numel == n
    assert fp32.param_bytes == 4 * n and fp32.gradient_bytes == 4 * n
    # AdamW: two fp32 moments per element, and one step count (a 4-byte scalar) per parameter tensor
    assert fp32.optimizer_moments == 2
    assert fp32.optimizer_bytes == 8 * n + 4 * len(list(Net().parameters()))
    assert fp32.input_bytes == 4 * ROWS * WIDTH
    assert fp32.block_param_numels == [2 * 4 * WIDTH * WIDTH + 5 * WIDTH] * LAYERS


def test_activations_scale_with_the_rows(capture, fp32):
    double = trace(capture, 2 * ROWS)

    def most(t):  # at the end of the forward pass: what it saved for the backward pass
        return max(sample.activations for sample in t.samples if sample.phase == 0)

    assert most(double) == pytest.approx(2 * most(fp32), rel=0.05)
    assert double.flops == 2 * fp32.flops
    # (no gradient for the input)
    assert 2 * fp32.forward_flops < fp32.flops < 3 * fp32.forward_flops


def test_ddp_holds_everything_and_its_buckets_are_the_gradients(fp32):
    m = rank_memory.ddp(fp32, Setting(world_size=8))
    assert (m.parameters, m.gradients, m.optimizer) == (
        fp32.param_bytes,
        fp32.gradient_bytes,
        fp32.optimizer_bytes,
    )
    assert m.at_peak["gradients"] == fp32.gradient_bytes and m.at_peak["buffers"] == 0
    assert m.peak == sum(m.at_peak[kind] for kind in KINDS)
    separate = rank_memory.ddp(fp32, Setting(world_size=8, ddp_bucket_view=False))
    assert separate.at_peak["buffers"] == fp32.gradient_bytes  # buckets besides the gradients
    assert separate.peak > m.peak


@pytest.mark.parametrize("world", [1, 2, 8, 64])
def test_zero_model_states_in_mixed_precision_are_the_paper_s_closed_forms(capture, world):
    """ZeRO paper, section 5: 2 + 2 + 12 bytes per parameter, sharded by stage (bf16 model, fp32
    master and Adam)."""
    bf16 = trace(capture, ROWS, param_dtype=torch.bfloat16)
    n = phi()
    part = zero_partition(n, world)
    one = rank_memory.zero12(1)(bf16, Setting(world_size=world))
    assert (one.parameters, one.gradients, one.optimizer) == (
        2 * part * world,
        2 * part * world,
        12 * part,
    )
    two = rank_memory.zero12(2)(bf16, Setting(world_size=world))
    assert (two.parameters, two.gradients, two.optimizer) == (2 * part * world, 2 * part, 12 * part)
    three = rank_memory.zero3(bf16, Setting(world_size=world, zero_persistence=0))
    shards = sum(math.ceil(p.numel() / world) for p in Net().parameters())
    assert (three.parameters, three.gradients, three.optimizer) == (
        2 * shards,
        2 * shards,
        12 * shards,
    )
    assert three.parameters + three.gradients + three.optimizer == 16 * shards
    assert 16 * shards == pytest.approx(
        16 * n / world, rel=len(list(Net().parameters())) * world / n + 1e-9
    )


def test_zero3_holds_the_largest_layer_whole_with_its_gradient_in_the_backward_pass(capture):
    """DeepSpeed's estimator (estimate_zero3_model_states_mem_needs) charges 4 bytes of the largest
    layer's parameters: its bf16 parameter gathered and its bf16 gradient whole before the
    reduce-scatter (here every gradient is larger than the 1-element bucket, so reduced alone).
    Besides them: the flat buffer of the layer's gather (weight and bias in one call,
    _all_gather_dtype; counted through the pass, an upper bound where DeepSpeed frees it once the
    two are copied out) and the one reduction that copies (the head's 10-element bias, padded to
    12 for 4 ranks; the others reduce in place)."""
    bf16 = trace(capture, ROWS, param_dtype=torch.bfloat16)
    setting = Setting(world_size=4, zero_persistence=0, zero_max_live=1, zero_bucket=1)
    largest = max(bf16.numels)
    layer = largest + 4 * WIDTH  # the up projection's weight and bias
    three = rank_memory.zero3(bf16, setting)
    kept = 2 * setting.zero_bucket
    backward = [s for s in bf16.samples if s.phase == 1]
    assert backward and three.at_peak["buffers"] >= kept + 4 * largest
    assert three.at_peak["buffers"] - kept == 2 * layer + 2 * layer + 2 * largest + 2 * 12


def test_zero3_keeps_small_parameters_whole(fp32):
    # every parameter here is under 100,000 elements
    kept = rank_memory.zero3(fp32, Setting(world_size=4))
    assert kept.parameters == 4 * (sum(math.ceil(n / 4) for n in fp32.numels) + fp32.numel)


def test_fsdp_at_bf16_gathers_bf16_on_fake_ranks_and_keeps_fp32_shards():
    """The plan shards its copy as the strategy does (rankwise.strategies.fsdp.shard), with the
    mixed-precision policy: the same fp32 shards and state, and the unsharded parameters bf16."""
    autocast = from_factory(build, (torch.randn(ROWS, WIDTH),), autocast=True)
    full, mixed = fsdp(autocast, ROWS, 4), fsdp(autocast, ROWS, 4, autocast=torch.bfloat16)
    assert (mixed.parameters, mixed.gradients) == (full.parameters, full.gradients)
    assert mixed.optimizer == full.optimizer
    # measured: activations 209,200 -> 81,820 B and buffers 400,176 -> 266,264 B (before the
    # policy, autocast over fp32 shards: 209,200 and 400,176 at bf16 too)
    assert mixed.at_peak["activations"] < 0.6 * full.at_peak["activations"]
    assert mixed.at_peak["buffers"] < full.at_peak["buffers"]


def test_the_first_fsdp_measurement_of_a_shape_is_the_same_as_the_next():
    """Was: the first measurement of a shape in a process counted DTensor's sharding propagation
    (its own fake tensors, computed once and cached) as the step's memory: a peak at the optimizer
    step of 1.5 MB of "optimizer" against 0.2 MB, and 2 KB of activations against 160 KB."""
    fresh = from_factory(build, (torch.randn(ROWS + 3, WIDTH),))
    first, second = fsdp(fresh, ROWS + 3, 3), fsdp(fresh, ROWS + 3, 3)
    assert first.at_peak == second.at_peak and first.peak == second.peak
    assert first.at_peak["optimizer"] == first.optimizer


@pytest.mark.parametrize("world", [1, 4])
def test_fsdp_on_fake_ranks_shards_parameters_gradients_and_state(capture, world):
    m = fsdp(capture, ROWS, world)
    padded = sum(
        math.ceil(p.shape[0] / world) * (p.numel() // p.shape[0]) for p in Net().parameters()
    )
    assert m.parameters == 4 * padded
    assert m.gradients == 4 * padded
    # (the last rank's shards are shorter, and step counts)
    assert m.optimizer == pytest.approx(8 * padded, rel=0.02)
    assert m.peak == sum(m.at_peak.values()) and m.at_peak["activations"] > 0


def test_collectives_per_step(fp32):
    grads, params = fp32.gradient_bytes, fp32.param_bytes
    [ddp] = collectives("ddp", fp32, 8, 1)
    assert (ddp.op, ddp.nbytes, ddp.overlapped) == ("all_reduce", grads, "backward")
    calls = {(c.op, c.what): c.nbytes for c in collectives("fsdp", fp32, 8, 2)}
    assert calls[("all_gather", "parameters, forward")] == 2 * params  # every micro-batch
    assert calls[("reduce_scatter", "gradients")] == grads  # once a step (no_sync)
    # at a mixed precision FSDP's policy gathers bf16, and reduce-scatters fp32
    half = {(c.op, c.what): c.nbytes for c in collectives("fsdp", fp32, 8, 2, half=True)}
    assert half[("all_gather", "parameters, forward")] == params
    assert half[("reduce_scatter", "gradients")] == grads
    assert {c.op for c in collectives("deepspeed-zero2", fp32, 8, 1)} == {
        "reduce_scatter",
        "all_reduce",  # the norm, every step
        "all_gather",
    }
    assert collectives("ddp", fp32, 1, 1) == []


def test_the_bandwidth_model_is_alpha_beta_with_nccl_tests_factors():
    link = Bandwidth(
        {"all_reduce": 1e9, "all_gather": 1e9, "reduce_scatter": 1e9},
        {"all_reduce": 1e-4, "all_gather": 1e-4, "reduce_scatter": 1e-4},
        measured_at=2,
    )
    # 2(n-1)/n = 1 at two ranks
    assert link.seconds("all_reduce", 1e9, 1, 2) == pytest.approx(1e-4 + 1.0)
    assert link.seconds("all_reduce", 1e9, 1, 8) == pytest.approx(3e-4 + 1.75)  # latency x log2(8)
    assert link.seconds("all_gather", 1e9, 4, 8) == pytest.approx(4 * 3e-4 + 0.875)
    assert link.seconds("all_reduce", 1e9, 1, 1) == 0


def _zero2_all_gathers() -> tuple[int, int]:
    """One rank: one ZeRO-2 step of the accounting model with two parameter groups (decay, none);
    DeepSpeed's all_gather_into_tensor calls counted (it binds torch's function as it starts)."""
    import torch.distributed as dist

    import rankwise

    calls: list[int] = []
    original = dist.all_gather_into_tensor

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    dist.all_gather_into_tensor = counting
    try:
        with rankwise.setup("deepspeed", options={"zero_stage": "2"}, seed=0) as rt:
            model = Net()
            decay = [p for p in model.parameters() if p.dim() > 1]
            rest = [p for p in model.parameters() if p.dim() <= 1]
            optimizer = torch.optim.AdamW(
                [{"params": decay}, {"params": rest, "weight_decay": 0.0}], lr=1e-3
            )
            model, optimizer = rt.prepare(model, optimizer)
            calls.clear()
            rt.backward(model(torch.randn(ROWS, WIDTH)).float().square().mean(), model)
            rt.step(optimizer, model)
            return len(calls), 2
    finally:
        dist.all_gather_into_tensor = original


@pytest.mark.multiproc
def test_zero2_all_gathers_once_per_parameter_group_as_planned(capture):
    """Was: one all-gather per reduce bucket (1,607 calls for Llama 3 8B); DeepSpeed 0.19 gathers
    each group's flat buffer in one all_gather_into_tensor (all_gather_dp_groups)."""
    from tests.support.multiproc import run_ranks

    # (a fresh pair of processes: DeepSpeed binds torch's collectives once per process, so a pool
    # rank that ran DeepSpeed before would not see the counting function)
    counted, groups = run_ranks(_zero2_all_gathers, 2, timeout=120, fresh=True)[0]
    assert counted == groups == 2
    built = from_factory(
        lambda: (
            (net := Net()),
            torch.optim.AdamW(
                [
                    {"params": [p for p in net.parameters() if p.dim() > 1]},
                    {"params": [p for p in net.parameters() if p.dim() <= 1]},
                ]
            ),
        ),
        (torch.randn(ROWS, WIDTH),),
    )
    [gather] = [
        c for c in collectives("deepspeed-zero2", trace(built, ROWS), 2, 1) if c.op == "all_gather"
    ]
    assert gather.calls == counted
