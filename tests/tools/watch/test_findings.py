"""The findings that need no reference, from rank records as the watcher writes them."""

from __future__ import annotations

from rankwise.tools.watch.findings import findings


def _pass(
    loader=0,
    samples=0,
    trained=0,
    first=(),
    size=None,
    distributed=False,
    shuffle=None,
    epoch=None,
    complete=True,
    combined=1,
    deduplicated=0,
):
    return {
        "loader": loader,
        "dataset_size": size,
        "batch_size": 8,
        "sampler": "DistributedSampler" if distributed else "SequentialSampler",
        "distributed_sampler": distributed,
        "shuffle": shuffle,
        "epoch": epoch,
        "samples": samples,
        "trained": trained,
        "first": list(first),
        "complete": complete,
        "collectives_after": combined,
        "deduplicated_after": deduplicated,
    }


def _record(rank, passes, world=2, **extra):
    return {
        "rank": rank,
        "world_size": world,
        "steps": 4,
        "passes": passes,
        "set_epoch_calls": 0,
        "collectives": {},
        "saves": [],
        "replicas_differ": [],
        "unscaled": [],
        "step_seconds": [0.1] * 4,
        "step_collective_seconds": [0.0] * 4,
        "framework_world_size": None,
        **extra,
    }


def test_distributed_sampler_padding_is_counted_twice_with_the_counts():
    # 41 samples over 2 ranks: the sampler pads one so each rank takes 21.
    records = [
        _record(r, [_pass(loader=1, samples=21, size=41, distributed=True, shuffle=False)])
        for r in (0, 1)
    ]
    (finding,) = findings(records, 2)
    assert (
        finding.level == "error"
        and "42 predictions over the 2 ranks for a 41-sample set" in finding.text
    )
    assert "pads 1 samples" in finding.text and "gather_for_metrics" in finding.text


def test_an_evaluation_repeated_on_every_rank_is_counted_twice_only_where_the_script_combines_it():
    gathered = [_record(r, [_pass(loader=1, samples=40, size=40)]) for r in (0, 1)]
    (twice,) = findings(gathered, 2)
    assert twice.level == "error" and "evaluation counted 80 predictions" in twice.text
    # Each rank evaluates the whole set and keeps its own result (rank 0 prints it): right, only
    # wasteful.
    alone = [_record(r, [_pass(loader=1, samples=40, size=40, combined=0)]) for r in (0, 1)]
    (wasted,) = findings(alone, 2)
    assert wasted.level == "warning" and wasted.text.startswith(
        "each of the 2 ranks evaluated the whole 40-sample"
    )


def test_samples_a_sampler_repeats_are_not_counted_twice_where_gather_for_metrics_drops_them():
    # Accelerate's even_batches: 30 samples, batch 8, 2 ranks -> 16 + 16, the last two repeated;
    # gather_for_metrics drops them (HF Trainer's evaluation uses it too).
    dropped = [_record(r, [_pass(loader=1, samples=16, size=30, deduplicated=1)]) for r in (0, 1)]
    assert findings(dropped, 2) == []
    kept = [_record(r, [_pass(loader=1, samples=16, size=30)]) for r in (0, 1)]
    assert "some samples were evaluated on more than one rank" in findings(kept, 2)[0].text


def test_an_evaluation_sharded_without_padding_is_not_a_finding():
    records = [
        _record(r, [_pass(loader=1, samples=20, size=40, distributed=True, shuffle=False)])
        for r in (0, 1)
    ]
    assert findings(records, 2) == []


def test_an_evaluation_on_one_ranks_shard_with_nothing_combined_is_counted_less():
    records = [
        _record(
            r, [_pass(loader=1, samples=32, size=64, distributed=True, shuffle=False, combined=0)]
        )
        for r in (0, 1)
    ]
    (finding,) = findings(records, 2)
    assert finding.level == "error" and finding.text.startswith(
        "rank 0 evaluated 32 of the 64 samples of loader 1"
    )
    assert "nothing was combined across the ranks" in finding.text
    # Only rank 0 evaluates its shard (the others skip evaluation): the same.
    (alone,) = findings([records[0], _record(1, [])], 2)
    assert alone.text == finding.text
    # A collective after the pass combined it; a loader that is not sharded evaluated the whole set.
    combined = [
        _record(r, [_pass(loader=1, samples=32, size=64, distributed=True, combined=1)])
        for r in (0, 1)
    ]
    assert findings(combined, 2) == []
    whole = [_record(0, [_pass(loader=1, samples=64, size=64, combined=0)]), _record(1, [])]
    assert findings(whole, 2) == []


def test_set_epoch_advice_fits_the_script():
    def passes(first):
        return [
            _pass(trained=16, first=first, distributed=True, shuffle=True, epoch=0)
            for _ in range(2)
        ]

    plain = findings([_record(0, passes("aceg")), _record(1, passes("bdfh"))], 2)
    assert "Call sampler.set_epoch(epoch) before" in plain[0].text
    on_setup = findings(
        [_record(0, passes("aceg"), api="rankwise"), _record(1, passes("bdfh"), api="rankwise")], 2
    )
    assert (
        "Call rt.set_epoch(loader, epoch) before" in on_setup[0].text
        and "sampler." not in on_setup[0].text
    )


def test_set_epoch_is_needed_only_where_the_sampler_shuffles_and_the_order_repeats():
    def passes(first, shuffle=True):
        return [
            _pass(trained=16, first=first, distributed=True, shuffle=shuffle, epoch=0)
            for _ in range(2)
        ]

    repeated = [_record(0, passes("aceg")), _record(1, passes("bdfh"))]
    assert [f.text.split(":")[0] for f in findings(repeated, 2)] == [
        "the training loader's DistributedSampler shuffles, but set_epoch was never called"
    ]
    unshuffled = [_record(0, passes("aceg", False)), _record(1, passes("bdfh", False))]
    assert findings(unshuffled, 2) == []
    called = [
        _record(0, passes("aceg"), set_epoch_calls=2),
        _record(1, passes("bdfh"), set_epoch_calls=2),
    ]
    assert findings(called, 2) == []


def test_every_rank_training_on_the_same_samples_is_an_unsharded_loader():
    records = [_record(r, [_pass(trained=16, first="abcdefgh")]) for r in (0, 1)]
    (finding,) = findings(records, 2)
    assert (
        finding.level == "error"
        and "not sharded" in finding.text
        and "DistributedSampler" in finding.text
    )
    sharded = [
        _record(0, [_pass(trained=16, first="aceg")]),
        _record(1, [_pass(trained=16, first="bdfh")]),
    ]
    assert findings(sharded, 2) == []


def test_a_value_read_back_every_step_is_a_sync_point_and_one_read_now_and_then_is_not():
    every = {".item() at train.py:12": {"calls": 4, "seconds": 0.004, "steps": 4}}
    (finding,) = findings(
        [_record(0, [], reads=every, device="cuda"), _record(1, [], reads=every)], 2
    )
    assert finding.level == "warning" and finding.text.startswith(
        ".item() at train.py:12 runs every step"
    )
    assert (
        "1.0% of the step time on rank 0" in finding.text
        and "total += loss.detach()" in finding.text
    )
    (on_cpu,) = findings([_record(0, [], reads=every, device="cpu")], 1)
    assert "on the CPU, where it costs nothing; on a GPU each call waits" in on_cpu.text
    seldom = {".item() at train.py:12": {"calls": 1, "seconds": 0.001, "steps": 1}}
    assert findings([_record(0, [], reads=seldom, device="cuda")], 1) == []


def test_a_collective_in_one_step_of_two_is_no_pattern_and_one_in_both_is():
    """A two-step verify: a call made once (the first step's checks) is not 'every step'; one made
    in both is."""

    def record(steps_seen):
        calls = len(steps_seen)
        site = {
            "all_gather_object at train.py:9": {"calls": calls, "seconds": 0.01, "steps": calls}
        }
        return _record(0, [], world=2, steps=2, step_seconds=[0.1, 0.1], collectives=site)

    assert findings([record([0]), record([0])], 2) == []
    (finding,) = findings([record([0, 1]), record([0, 1])], 2)
    assert finding.text.startswith(
        "all_gather_object at train.py:9 runs every step (2 calls in 2 steps)"
    )


def test_a_collective_rankwise_makes_for_the_script_is_named_as_the_framework_s():
    """In a script on rankwise.setup(), a collective inside rt.step is rankwise's, made from the
    script's line (here this test's), as a framework's in site-packages is: before, it counted as
    the script's own call."""
    from rankwise import dist as library
    from rankwise.tools.watch import calls
    from rankwise.tools.watch.ranks import call_site

    def patched_collective():  # the watcher's wrapper around a torch.distributed call
        return call_site(via=True)

    def in_the_library():  # rankwise.dist, as rt.step calls it
        return patched_collective()

    patched_collective.__code__ = patched_collective.__code__.replace(co_filename=calls.__file__)
    in_the_library.__code__ = in_the_library.__code__.replace(co_filename=library.__file__)
    site = in_the_library()
    assert site.startswith("test_findings.py:") and "(via rankwise/dist.py:" in site, site


def test_the_scripts_own_rt_all_reduce_stays_the_scripts_call():
    """``rt.all_reduce(loss)`` every step is the script's sync point (its fix is the script's), not
    rankwise's."""
    from rankwise import dist as library
    from rankwise import runtime
    from rankwise.tools.watch import calls
    from rankwise.tools.watch.ranks import call_site

    def patched_collective():
        return call_site(via=True)

    def in_the_library():
        return patched_collective()

    def all_reduce():  # Runtime.all_reduce, as the script calls it
        return in_the_library()

    patched_collective.__code__ = patched_collective.__code__.replace(co_filename=calls.__file__)
    in_the_library.__code__ = in_the_library.__code__.replace(co_filename=library.__file__)
    all_reduce.__code__ = all_reduce.__code__.replace(co_filename=runtime.__file__)
    site = all_reduce()
    assert site.startswith("test_findings.py:") and "via" not in site, site


def test_a_script_making_the_same_batch_on_every_rank_is_unsharded_and_one_drawn_per_rank_is_not():
    """No DataLoader (pytorch/examples' FSDP2 example: torch.manual_seed(0) on every rank, then
    torch.randint for each batch): the model's first training inputs tell."""
    same = [_record(r, [], first_inputs=list("abcdefgh")) for r in (0, 1)]
    (finding,) = findings(same, 2)
    assert finding.kind == "unsharded" and finding.level == "error"
    assert "without a DataLoader" in finding.text
    drawn = [_record(0, [], first_inputs=list("abcd")), _record(1, [], first_inputs=list("efgh"))]
    assert findings(drawn, 2) == []
    assert findings([_record(r, []) for r in (0, 1)], 2) == []  # (nothing recorded: no finding)


def _metrics(loss_prints=None, loss_reads=None):
    return {
        "unsynced_logs": {},
        "unsynced_metrics": {},
        "loss_reads": loss_reads or {},
        "printed_losses": {},
        "loss_prints": loss_prints or {},
    }


def test_a_loss_every_rank_prints_from_its_shard_is_an_error_and_rank_0_s_alone_a_warning():
    """Fabric's image classifier and Horovod's MNIST print loss.item() on every rank: N lines for
    one step, none the global batch's loss."""
    site = {"train.py:121": 3}
    everywhere = [_record(r, [], metrics=_metrics(site, site)) for r in (0, 1)]
    (finding,) = findings(everywhere, 2)
    assert finding.kind == "per-rank-metric" and finding.level == "error"
    assert "every one of the 2 ranks prints its own training loss at train.py:121" in finding.text
    alone = [
        _record(0, [], metrics=_metrics(site, site)),
        _record(1, [], metrics=_metrics()),
    ]
    (finding,) = findings(alone, 2)
    assert finding.kind == "per-rank-metric" and finding.level == "warning"
    assert "rank 0 alone" in finding.text


def test_repeats_a_script_cuts_off_what_it_gathered_are_not_counted_twice():
    # Accelerate's multi_process_metrics example: 408 samples, even_batches pads each rank to 224;
    # gather returns all 448 and the script cuts the last gathered batch by the 40 repeats.
    def records(trimmed):
        return [
            _record(r, [_pass(loader=1, samples=224, size=408) | {"trimmed_after": trimmed}])
            for r in (0, 1)
        ]

    assert findings(records(40), 2) == []
    (partly,) = findings(records(8), 2)  # some cut, not all of the repeats: still counted twice
    assert partly.kind == "counted-more" and "448 predictions" in partly.text


def test_a_loss_summed_over_the_batch_is_named_at_several_ranks_only():
    summed = ".sum() of a (8, 2) tensor, its first dimension the batch"
    (finding,) = findings([_record(r, [], summed_loss=summed) for r in (0, 1)], 2)
    assert finding.kind == "loss-mean" and "1/2 of the one process's" in finding.text
    assert summed in finding.text
    assert findings([_record(0, [], world=1, summed_loss=summed)], 1) == []
