"""The long tier: real-rank tests that ``make test`` leaves to ``make test-long``.

``make test`` must fit CI (90 minutes for the set-up, the suite, the documentation tier and the
demo, on 2 cores whose speed varies 2.5x from one day to the next: the same suite took 34.6 and
87.5 minutes).  Each test named here repeats a behaviour that a shorter real-rank test in
``make test`` already runs (``covered by``), or is a second strategy, precision or launcher of one;
the few that check a behaviour nothing shorter reaches say so (``only here``).  Every one of them
still runs, and must pass, under ``make test-long``, before a change to what it covers lands.

A key is a test's node id, with its parameters (``[...]``) for one case or without them for all;
``tests/test_tiers.py`` checks that each names a test that exists.
"""

from __future__ import annotations

LONG: dict[str, str] = {
    # rankwise bench --script (tests/tools/bench/test_user_script.py: 1,214 s of 1,269 on a slow
    # day)
    "tests/tools/bench/test_user_script.py::test_a_stock_language_model_passes_every_rows_equivalence_and_"
    "the_row_says_how_it_was_compared": "covered by: test_verify_scripts' FSDP2 global token mean "
    "(a language model, verify) and test_bench_scripts' plain DDP rows (bench --script)",
    "tests/tools/bench/test_user_script.py::test_a_script_shorter_than_the_window_runs_again_and_its_"
    "windows_are_pooled": "only here: pooled windows of a script shorter than the window",
    "tests/tools/bench/test_user_script.py::test_a_fast_script_is_timed_over_a_window_of_seconds_with_"
    "the_spread_over_repeats": "only here: the least window, the repeats' spread, --explain",
    "tests/tools/bench/test_user_script.py::test_batch_norm_under_ddp_is_not_equivalent_and_the_row_says_"
    "why": "covered by: test_verify's batch-norm case (the row's reason is verify's)",
    "tests/tools/bench/test_user_script.py::test_a_plain_data_loader_is_counted_from_what_reached_the_"
    "model_and_never_passes": "covered by: test_verify's plain-loader case",
    "tests/tools/bench/test_user_script.py::test_steps_past_the_scripts_length_say_how_many_it_"
    "ran": "covered by: test_verify_scripts' more steps than the script trains",
    # framework scripts under bench --script and verify
    "tests/tools/watch/test_bench_scripts.py::test_fabric_strategies_are_rows_through_its_launch_"
    "setting_and_one_it_cannot_run_here_says_why": "covered by: test_verify_scripts' Fabric "
    "launch (cpu mode) and test_frameworks",
    "tests/tools/watch/test_bench_scripts.py::test_a_fabric_loop_gets_world_size_rows_that_pass": (
        "covered by: test_a_plain_ddp_scripts_defective_form_fails_its_row_with_the_finding"
    ),
    "tests/tools/watch/test_bench_scripts.py::test_accelerates_quick_tour_gets_a_row_per_world_"
    "size_and_a_passing_equivalence_column": "covered by: test_verify_scripts' Accelerate "
    "scheduler case",
    "tests/tools/watch/test_deepspeed_scripts.py::test_bench_rows_by_world_size_with_lockstep_"
    "equivalence": "covered by: the two DeepSpeed verify tests beside it",
    "tests/tools/watch/test_horovod_scripts.py::test_bench_rows_by_world_size_with_lockstep_"
    "equivalence": "covered by: the Horovod verify test beside it",
    "tests/tools/watch/test_verify_scripts.py::test_a_lightning_trainer_script_is_named_so_and_its_"
    "padded_validation_is_found": "only here: a Lightning Trainer under verify (the zoo's "
    "lightning cases too)",
    "tests/tools/watch/test_verify_scripts.py::test_a_lightning_fabric_loop_is_equivalent_and_"
    "batch_norm_is_flagged": "covered by: test_verify's batch-norm case; Fabric by the zoo",
    "tests/tools/watch/test_verify_scripts.py::test_a_tutorial_script_that_trains_nothing_on_"
    "unseeded_data_says_so": "covered by: the zoo's fast DDP tutorial case",
    "tests/tools/watch/test_verify_scripts.py::test_trainers_default_loss_scaling_is_caught_behind_"
    "an_unseeded_model_and_its_setting_fixes_it": "only here: transformers' Trainer under verify",
    "tests/tools/watch/test_verify_scripts.py::test_a_batching_the_reference_cannot_scale_is_named_"
    "and_reference_args_fix_it": "only here: --reference-args",
    "tests/tools/watch/test_verify_scripts.py::test_accelerates_quick_tour_is_equivalent_and_batch_"
    "norm_is_diagnosed": "covered by: the Accelerate scheduler case and test_verify's batch norm",
    "tests/tools/watch/test_verify_scripts.py::test_a_multi_epoch_ddp_script_is_checked_whole_and_"
    "its_later_defects_are_each_found": "covered by: test_an_mp_spawn_script_starts_as_it_starts_"
    "itself_and_a_missing_set_epoch_is_found",
    # plan
    "tests/tools/plan/test_validate.py::test_validate_at_two_ranks_holds_memory_within_the_stated_"
    "bound_for_every_strategy": "covered by: test_the_ddp_tutorial_script_plans_as_written "
    "(plan's rows); --validate's real runs only here",
    "tests/tools/plan/test_command.py::test_an_8b_model_too_large_for_this_machine_is_planned_"
    "without_allocating_it": "covered by: test_the_ddp_tutorial_script_plans_as_written (the same "
    "capture at a small size)",
    # launchers, faults, hosts
    "tests/launch/test_script_exit.py::test_ten_launches_of_a_script_that_leaves_its_group_open_"
    "all_exit_cleanly_within_seconds": "covered by: test_exits (one launch of each exit hang)",
    "tests/launch/test_multinode.py::test_an_elastic_job_shrinks_when_a_node_dies_and_grows_back_"
    "when_it_returns": "only here: an elastic job across a node's loss and return",
    "tests/launch/test_multinode.py::test_c10d_rendezvous_with_an_elastic_node_range_trains_like_"
    "one_host": "covered by: test_launch_with_c10d_rendezvous_across_two_hosts",
    "tests/launch/test_slurm.py::test_a_node_dying_mid_job_ends_it_naming_the_node": (
        "covered by: test_multinode's link going down mid-training"
    ),
    "tests/launch/test_faults.py::test_sigterm_checkpoints_at_a_step_boundary_exits_143_and_"
    "resumes_exactly[spawn]": "covered by: the same test under torchrun",
    # a strategy's second precision, optimizer or model
    "tests/strategies/test_horovod.py::test_horovod_bf16_mixed_stays_close_to_single_bf16": (
        "covered by: test_dp_precision's bf16-mixed under ddp"
    ),
    "tests/strategies/test_horovod.py::test_horovod_matches_single_process_on_tiny_bert": (
        "covered by: test_horovod_matches_single_process"
    ),
    "tests/runtime/test_runtime.py::test_horovod_public_loop": (
        "covered by: test_public_loop_resumes_bitwise_and_matches_single"
    ),
    "tests/strategies/test_dp_precision.py::test_bf16_mixed_stays_close_to_single_bf16[fsdp]": (
        "covered by: the same test under ddp"
    ),
    "tests/strategies/test_dp_precision.py::test_bf16_mixed_stays_close_to_single_bf16"
    "[accelerate]": "covered by: the same test under ddp",
    "tests/examples/test_own_scripts.py::test_the_language_model_at_library_defaults_stays_"
    "equivalent_over_50_steps": "only here: 50 steps of a language model at library defaults "
    "(drift over a long window); a language model's first steps under FSDP2: test_verify_scripts' "
    "FSDP2 global token mean",
    "tests/examples/test_own_scripts.py::test_the_cnn_at_its_optimizers_defaults_is_equivalent_"
    "under_every_strategy[deepspeed-zero2-adam]": "covered by: deepspeed-zero3-adam",
    "tests/examples/test_own_scripts.py::test_the_cnn_at_its_optimizers_defaults_is_equivalent_"
    "under_every_strategy[deepspeed-zero2-sgd]": "covered by: deepspeed-zero3-adam",
    "tests/examples/test_own_scripts.py::test_the_cnn_at_its_optimizers_defaults_is_equivalent_"
    "under_every_strategy[deepspeed-zero3-sgd]": "covered by: deepspeed-zero3-adam and ddp-sgd",
    "tests/examples/test_own_scripts.py::test_the_cnn_at_its_optimizers_defaults_is_equivalent_"
    "under_every_strategy[fsdp-sgd]": "covered by: fsdp-adam and ddp-sgd",
    "tests/examples/test_own_scripts.py::test_the_cnn_at_its_optimizers_defaults_is_equivalent_"
    "under_every_strategy[accelerate-sgd]": "covered by: accelerate-adam and ddp-sgd",
    # second cases of a behaviour
    "tests/tools/test_verify.py::test_each_way_to_differ_is_found_at_its_first_step_and_diagnosed"
    "[micro-mean-expected1]": "covered by: test_verify_scripts' FSDP2 per-micro-batch mean",
    "tests/tools/test_verify.py::test_each_way_to_differ_is_found_at_its_first_step_and_diagnosed"
    "[half-expected4]": "covered by: test_deepspeed_scripts' bf16 gradients cause",
    "tests/tools/watch/test_verify_scripts.py::test_a_validation_on_rank_0s_shard_only_is_found_and_"
    "summing_the_counts_fixes_it": "covered by: test_metrics_a_rank_reports_from_its_own_shard_are_"
    "found",
    "tests/examples/test_own_scripts.py::test_the_cnn_at_its_optimizers_defaults_is_equivalent_"
    "under_every_strategy[accelerate-adam]": "covered by: test_verify_scripts' Accelerate cases",
    # the second cut (the CI run after the first still ran out of its 90 minutes: its suite and
    # documentation tier 45 + 43.5 minutes)
    "tests/tools/bench/test_suite.py::test_the_report_has_every_column_valid_json_and_a_png": (
        "covered by: CI's make demo DEMO_PRESET=smoke and make test-docs' bench.md blocks (the "
        "built-in bench, every row run and checked, its report.json and png written); the columns "
        "asserted one by one only here"
    ),
    "tests/tools/bench/test_suite.py::test_timed_rows_run_at_the_apps_stock_settings_and_each_row_"
    "says_which_check_judged_it": "covered by: the same (the demo's table names each row's "
    "criterion); the rows' settings asserted only here",
    "tests/tools/bench/test_suite.py::test_a_wrong_run_fails_the_count_check": (
        "only here: a deliberately wrong built-in row failing its count check"
    ),
    "tests/tools/bench/test_suite.py::test_a_rows_check_stops_its_ranks_after_the_compared_steps": (
        "covered by: test_verify_scripts' as-written run (the compared window, then the rest cut)"
    ),
    "tests/launch/test_multinode.py::test_two_hosts_train_like_one_host_with_the_same_world_size": (
        "covered by: test_slurm's sbatch example (two hosts train like one host)"
    ),
    "tests/examples/test_examples.py::test_completed_ddp_run_always_exits_zero[1]": (
        "covered by: attempt 0 (the repeats catch an intermittent abort at exit)"
    ),
    "tests/examples/test_examples.py::test_completed_ddp_run_always_exits_zero[2]": (
        "covered by: attempt 0"
    ),
    "tests/strategies/test_deepspeed.py::test_zero3_processes_exit_cleanly[1]": (
        "covered by: attempt 0 (the repeats catch an intermittent SIGABRT at exit)"
    ),
    "tests/strategies/test_deepspeed.py::test_zero3_processes_exit_cleanly[2]": (
        "covered by: attempt 0"
    ),
    "tests/tools/watch/test_deepspeed_scripts.py::test_an_unseeded_zero2_script_without_set_epoch_"
    "is_followed_step_by_step_and_its_defect_found": "covered by: test_zero3_unseeded_bf16_is_"
    "followed_from_step_0 (a DeepSpeed script followed) and the mp.spawn script's set_epoch",
    "tests/launch/test_faults.py::test_a_rank_that_raises_is_named_first_and_the_others_stop_within_"
    "seconds[spawn]": "covered by: the same test under torchrun",
    "tests/docs/test_readme.py::test_the_quick_start_training_command_runs": (
        "covered by: make test-docs (CI), which runs the README's train commands as written"
    ),
    "tests/strategies/test_dp_precision.py::test_bf16_mixed_stays_close_to_single_bf16[dp]": (
        "covered by: the same test under ddp"
    ),
    "tests/examples/test_own_scripts.py::test_the_cnn_at_its_optimizers_defaults_is_equivalent_"
    "under_every_strategy[ddp-adam]": "covered by: ddp-sgd and fsdp-adam",
    "tests/cli/test_cli.py::test_same_command_same_weights_and_tokenizer": (
        "covered by: test_faults' killed rank restarting to bitwise-equal weights and "
        "test_position's resume to the uninterrupted weights (a run's weights reproduced)"
    ),
    "tests/tools/bench/test_sharded_memory.py::test_memory_benchmark_tabulates_the_runs_with_and_without_"
    "checkpointing": "only here: the memory benchmark's table (activation checkpointing on, off)",
}
"""Node id -> why ``make test`` can leave it to ``make test-long``."""


WHY_RANKS = (
    "test_the_parts_add_up_to_the_step_and_every_step_is_profiled_before_the_window",
    "test_a_slow_data_loader_on_rank_1_is_its_data_wait_and_rank_0_waits_for_it",
    "test_a_slow_sample_now_and_then_on_rank_1_is_named_as_its_data_wait_over_the_window",
    "test_a_slow_forward_on_rank_1_names_rank_1_as_the_straggler",
    "test_a_per_step_barrier_and_item_are_host_syncs_named_by_line",
    "test_tiny_ddp_buckets_expose_more_communication_and_are_named",
    "test_a_clean_script_has_no_straggler_data_or_sync_cause",
)
EXIT_TIMING = (
    "test_a_rank_that_keeps_the_gil_as_main_returns_is_named_with_its_line_and_ended",
    "test_computing_alone_after_destroying_the_group_for_longer_than_the_grace_is_not_a_hang",
    "test_gloos_exit_deadlock_hangs_under_torchrun_and_every_launch_exits_cleanly_under_rankwise",
)
# Timing on a quiet machine: each failed beside the other pytest-xdist worker on a slow day (the
# 87-minute suite), where a step's parts, a rank's waits and a launch's seconds are the load's.
LONG.update(
    {
        **{
            f"tests/tools/bench/test_why_ranks.py::{name}": "only here: bench's per-rank causes, "
            "timed on a quiet machine"
            for name in WHY_RANKS
        },
        **{
            f"tests/launch/test_exits.py::{name}": "only here: the exit guard's grace and hang "
            "timing, on a quiet machine"
            for name in EXIT_TIMING
        },
    }
)


def is_long(nodeid: str) -> bool:
    """Whether the test ``nodeid`` is in the long tier (named with or without its parameters)."""
    return nodeid in LONG or nodeid.split("[", 1)[0] in LONG
