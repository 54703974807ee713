"""What each ZeRO stage is: the state it shards and the collectives a step makes (DeepSpeed 0.19,
``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py``), declared for the
``deepspeed-zeroN`` variants (:mod:`rankwise.strategies.deepspeed`) that ``rankwise plan`` and
``rankwise bench`` read."""

from __future__ import annotations

from rankwise.strategies.facts import Facts, StepCall
from rankwise.strategies.options import DeepSpeedOptions

_BUCKET = DeepSpeedOptions().bucket_size
_REDUCE = StepCall(
    "reduce_scatter",
    "gradients",
    "element-buckets",
    "",  # overlap_comm is false below stage 3: the reduction waits for its bucket to fill
    "gradients (reduced to their owners)",
    bucket=_BUCKET,
)
_NORM = StepCall(
    "all_reduce",
    "norm",
    "parameter-groups",
    "",
    # every step, clipped or not: the norm DeepSpeed logs and clips by, one per parameter group
    # (scaled_global_norm; counted on gloo at 2 ranks)
    "the gradients' norm (overflow check, clipping)",
)
_NORM_3 = StepCall(
    "all_reduce",
    "norm",
    # ZeRO-3 reduces one norm per optimizer sub-group (stage3_sub_group_size elements of the
    # rank's partitions, rankwise's deepspeed.bucket_size; _get_norm_groups)
    "zero3-sub-groups",
    "",
    "the gradients' norm (overflow check, clipping)",
    bucket=_BUCKET,
)
_GATHER_UPDATED = StepCall(
    "all_gather",
    "parameters",
    # one all_gather_into_tensor per parameter group's flat buffer (all_gather_dp_groups)
    "parameter-groups",
    "",
    "updated parameters, after the step",
)
STAGE_FACTS = {
    0: Facts(layout=None, planned=False, bench="opt-in", about="DeepSpeed's engine, no sharding"),
    1: Facts(
        shards=frozenset({"optimizer"}),
        step=(_REDUCE, _NORM, _GATHER_UPDATED),
        layout="flat-partitions",
        casts_model=True,
        bench="full",
        about="DeepSpeed ZeRO-1: optimizer state sharded",
    ),
    2: Facts(
        shards=frozenset({"optimizer", "gradients"}),
        step=(_REDUCE, _NORM, _GATHER_UPDATED),
        layout="flat-partitions",
        casts_model=True,
        about="ZeRO-2: also gradients",
    ),
    3: Facts(
        shards=frozenset({"optimizer", "gradients", "parameters"}),
        step=(
            # a module's partitioned parameters gathered before it runs, with the next uses
            # prefetched up to stage3_prefetch_bucket_size in the same pass; gathered again in the
            # backward only where released in between (past stage3_max_live_parameters or the
            # reuse distance), every micro-batch; overlap_comm and prefetching hide them
            StepCall(
                "all_gather",
                "partitioned-parameters",
                "zero3-fetches",
                "forward",
                "parameters, forward",
                every_micro_batch=True,
            ),
            StepCall(
                "all_gather",
                "partitioned-parameters",
                "zero3-fetches",
                "backward",
                "parameters, backward",
                every_micro_batch=True,
            ),
            StepCall(
                "reduce_scatter",
                "gradients",
                "element-buckets",
                "backward",
                "gradients",
                bucket=_BUCKET,
            ),
            _NORM_3,
            # the parameters kept whole (below stage3_param_persistence_threshold) are stepped in
            # their partition and gathered again after the step, one call each
            StepCall(
                "all_gather",
                "persistent-parameters",
                "each",
                "",
                "parameters kept whole, after the step",
            ),
        ),
        layout="parameter-partitions",
        casts_model=True,
        bench="full",
        about="ZeRO-3: also parameters",
    ),
}
"""What each ZeRO stage shards and communicates (DeepSpeed 0.19, ``stage_1_and_2.py`` and
``stage3.py``); the ``deepspeed`` strategy itself takes its stage from its options, so only the
variants are planned."""
