"""The built-in task's training loop, written only against the public
:class:`~rankwise.runtime.Runtime` API.

The same code runs under every strategy.  Per optimizer step: ``grad_accum`` micro-batches, gradient
synchronisation only on the last (``no_sync`` before), clip, step (with clipping), schedule.  No
barrier and no ``.item()`` per step: the loss is reduced across ranks only when it is logged.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from tqdm import tqdm

from rankwise.data.prepare import PreparedData
from rankwise.errors import ConfigError
from rankwise.logs import get_logger
from rankwise.measure.flops import devices, fake_counter, padded_length, rows
from rankwise.measure.memory import peak_rss_megabytes
from rankwise.measure.throughput import SteadyThroughput, count_tokens
from rankwise.models import build_model, reads_ngrams
from rankwise.models.attention import attention_for_varying_lengths
from rankwise.process import restart_count
from rankwise.runtime import Runtime, setup
from rankwise.sampling.batching import iterate_steps
from rankwise.train import artifacts, continuity
from rankwise.train.compiling import CompileWatch
from rankwise.train.config import TrainConfig
from rankwise.train.evaluate import evaluate, forward_logits, write_results
from rankwise.train.metrics import LossWindow, MetricsLog
from rankwise.train.optim import lr_lambda, make_optimizer
from rankwise.train.preemption import StopRequest
from rankwise.train.profiling import LoopProfile
from rankwise.train.rundir import LAUNCH_ID, RunDir
from rankwise.train.schedule import Schedule
from rankwise.train.utilisation import utilisation

log = get_logger(__name__)


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        data: PreparedData,
        run_dir: Path,
        rt: Runtime,
        step_end_hooks: Sequence[Callable[[int, int], None]] = (),
    ):
        self.cfg, self.data, self.run_dir, self.rt = cfg, data, RunDir(run_dir), rt
        attention_for_varying_lengths(rt.device)
        self.step_end_hooks = list(step_end_hooks)
        """Called as ``hook(rank, step)`` after every optimizer step (the tests' fault
        injection)."""
        model, self.model_spec = build_model(
            cfg.model.name,
            num_labels=data.num_labels,
            dropout=cfg.model.dropout,
            vocab_size=data.encoder.vocab_size if data.encoder else None,
            pad_id=data.encoder.pad_id if data.encoder else 0,
            max_length=cfg.data.max_length,
            features=data.features,
            split_devices=cfg.model.split_devices,
            local_rank=rt.local_rank,
            pooling=cfg.model.pooling,
            ngrams=data.ngrams.to_dict() if data.ngrams else None,
        )
        ngrams = reads_ngrams(self.model_spec)
        pad = cfg.data.pad_to_multiple_of or (16 if rt.device.type == "cuda" or cfg.compile else 1)
        split = partial(
            data.dataset, ngrams=ngrams, pad_multiple=pad, pad_limit=cfg.data.max_length
        )
        self.train_set = split("train")
        self.eval_sets = {name: split(name) for name in ("dev", "test") if data.size(name)}
        if cfg.model.init_weights:
            model.load_state_dict(artifacts.load_checkpoint(cfg.model.init_weights).weights)
        self.num_parameters = sum(p.numel() for p in model.parameters())
        # Counts the model's FLOPs on a fake copy made before the strategy shards or compiles it.
        self.flop_counter = fake_counter(model, forward_logits, rt.autocast)
        self.flop_template: dict | None = None
        optimizer = make_optimizer(model, cfg, rt.device)
        self.micro_batch = cfg.micro_batch_size(rt.world_size)
        self.model, self.optimizer = rt.prepare(
            model,
            optimizer,
            grad_accum=cfg.grad_accum,
            micro_batch_size=self.micro_batch,
            compile=cfg.compile,
            activation_checkpointing=cfg.model.activation_checkpointing,
        )
        # Weights are initialised identically on every rank (same seed); from here on each
        # rank gets its own stream so dropout masks differ between ranks, as they should.
        torch.manual_seed(cfg.seed + rt.rank)
        collate = getattr(self.train_set, "collate", None)
        lengths = getattr(self.train_set, "lengths", None) if cfg.data.group_by_length else None
        self.loader = rt.loader(
            self.train_set,
            self.micro_batch * rt.world_size,
            shuffle=True,
            seed=cfg.seed,
            collate_fn=collate,
            lengths=lengths,
            group_size=cfg.batch_size,
        )
        self.loader.say = None  # after a resume this loop prints its own, fuller continuity record
        # >= 1: the loader refuses fewer samples
        self.steps_per_epoch = len(self.loader) // cfg.grad_accum
        self.total_steps = cfg.epochs * self.steps_per_epoch
        if cfg.max_steps:
            self.total_steps = min(self.total_steps, cfg.max_steps)
        self.profile = LoopProfile(rt, 0, 0)
        """Steps profiled for the summary's breakdown (set up by :meth:`fit`, where
        ``profile_steps`` asks)."""
        self.schedule = Schedule.of(
            total_steps=self.total_steps,
            steps_per_epoch=self.steps_per_epoch,
            log_every=cfg.log_every,
            save_every=cfg.save_every,
            save_at_steps=cfg.save_at_steps,
            evaluate_dev="dev" in self.eval_sets and cfg.dev_each_epoch,
        )
        warmup = int(cfg.optim.warmup_ratio * self.total_steps)
        self.scheduler = LambdaLR(
            self.optimizer, lr_lambda(cfg.optim.schedule, warmup, self.total_steps)
        )
        self.step = 0
        self.data_digest = data.digest("train")
        self.last_logged: dict | None = None
        """The last logged loss ({"step", "value"}), recorded in checkpoints for the continuity
        record."""
        self.continuity_check: continuity.PendingCheck | None = None
        """After a resume, until its first step has trained and been checked."""
        self.step_tokens, self.step_shapes = 0, list[tuple[int, int | None]]()
        """This rank's tokens and micro-batch shapes of the step in progress (for throughput and
        FLOPs)."""
        self.checkpoint_path: Path | None = None
        self.saved_step: int | None = None
        self.train_peak_rss_mb = 0.0

    # -- state -------------------------------------------------------------------------------
    def save(self, epoch: int) -> None:
        files: dict[str, str | Path] = {
            artifacts.CONFIG: self.cfg.to_json(),
            artifacts.MODEL_SPEC: json.dumps(self.model_spec, indent=2, ensure_ascii=False),
            artifacts.LABELS: json.dumps(self.data.label_names, ensure_ascii=False),
        }
        if self.run_dir.tokenizer.is_file():
            files[artifacts.TOKENIZER] = self.run_dir.tokenizer
        facts = {
            **continuity.position(
                self.loader.sampler, self.steps_per_epoch, self.cfg.batch_size, self.step
            ),
            "step": self.step,
            "data": self.data_digest,
            "lr": self.scheduler.get_last_lr()[0],
            "loss": self.last_logged,
            "strategy": self.rt.strategy_name,
            "world_size": self.rt.world_size,
        }
        self.checkpoint_path = self.rt.save_state(
            self.run_dir.checkpoints,
            self.model,
            self.optimizer,
            self.scheduler,
            extra={"epoch": epoch, "continuity": facts},
            step=self.step,
            files=files,
            keep=self.cfg.keep_checkpoints,
            meta={"continuity": facts},
        )
        self.saved_step = self.step

    def latest_to_continue(self) -> str | None:
        """``"latest"`` where this worker group continues its run (torchrun restarted it, or a node
        joined an elastic job) and the run directory holds a checkpoint; else ``None``.  Rank 0
        decides for all: each node's agent counts its own restarts, so a node that joins later has 0
        where the survivors have more."""
        decision = None
        if self.rt.is_main and (restart_count() or len(self.cfg.world_sizes) > 1):
            checkpoints = self.run_dir.checkpoints
            if self.run_dir.latest.is_symlink() or any(checkpoints.glob("step-*")):
                decision = "latest"
        # Why: loading is a collective; every rank must load the same checkpoint, or none.
        return self.rt.broadcast_object(decision)

    def resume(self, path: str) -> None:
        if path == "latest":
            path = str(self.run_dir.latest)
        state = self.rt.load_state(
            path, self.model, self.optimizer, self.scheduler, strict=self.cfg.strict
        )
        self.step = state["step"]
        log.info(f"resumed at step {self.step}")
        if state.get("continuity") and self.step < self.total_steps:
            # This run's own schedule at the step (its lambdas come from this run's configuration).
            lr = float(self.scheduler.base_lrs[0]) * self.scheduler.lr_lambdas[0](self.step)
            self.continuity_check = continuity.PendingCheck(state["continuity"], lr)

    def report_continuity(self, loss_sum: torch.Tensor) -> None:
        """After the first resumed step: check and record that the data continued (a collective)."""
        # only this step's loss is in the sum
        loss = self.rt.all_reduce(loss_sum.clone(), "mean").item()
        check, self.continuity_check = self.continuity_check, None
        # called at the first step after a resume, while its check is pending
        assert check is not None
        record = continuity.first_step_record(
            self.rt,
            self.loader,
            check.facts,
            check.trained,
            step=self.step - 1,
            steps_per_epoch=self.steps_per_epoch,
            batch_size=self.cfg.batch_size,
            lr_resumed=check.lr,
            loss=loss,
            data_digest=self.data_digest,
            resumed_from=f"the checkpoint of step {self.step - 1}",
        )
        if self.rt.is_main:
            continuity.write(self.run_dir.root, record)
        log.info(continuity.describe(record))
        if not record["continuous"]:
            raise RuntimeError(
                f"rank {self.rt.rank}: the resumed run did not continue the checkpoint's sample "
                f"order ({', '.join(k for k, ok in record['checks'].items() if not ok)} differ); "
                f"see {self.run_dir.root / continuity.FILE}"
            )

    # -- training ----------------------------------------------------------------------------
    def train_step(self, batch: dict, sync: bool) -> torch.Tensor:
        batch = self.rt.to_device(batch)
        with self.rt.no_sync(self.model, enabled=not sync):
            with self.rt.autocast(), self.profile.mark("forward"):
                logits = forward_logits(self.model, batch)
                loss = nn.functional.cross_entropy(
                    logits.float(),
                    batch["labels"].to(logits.device),
                    label_smoothing=self.cfg.optim.label_smoothing,
                )
            with self.profile.mark("backward"):
                self.rt.backward(loss / self.cfg.grad_accum, self.model)
        return loss.detach()

    def optimizer_step(self) -> None:
        with self.profile.mark("optimizer"):
            self.rt.step(self.optimizer, self.model, max_norm=self.cfg.optim.max_grad_norm)
            self.rt.zero_grad(self.optimizer)
            self.scheduler.step()
        self.step += 1

    def fit(self) -> dict:
        cfg, rt = self.cfg, self.rt
        resume = cfg.resume or self.latest_to_continue()
        if resume:
            self.resume(resume)
        self.check_ranks_agree()
        start_step = self.step
        self.metrics = MetricsLog(self.run_dir, rt.is_main, resumed_step=start_step)
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc=f"{cfg.strategy} x{rt.world_size}",
            unit="step",
            disable=not (rt.is_main and cfg.progress),
            dynamic_ncols=True,
        )
        stop = StopRequest()
        # The run's last steps are profiled where asked (profile_steps), after the timed window:
        # the throughput counts the steps between the warm-up and them (train/profiling.py).
        profiled = (
            cfg.profile_steps
            if self.total_steps > start_step + cfg.throughput_warmup_steps + cfg.profile_steps
            else 0
        )  # (a run too short to keep a steady step before them profiles none)
        warmed = start_step + cfg.throughput_warmup_steps
        self.profile = LoopProfile(rt, profiled, self.total_steps - profiled, warmed)
        self.throughput = SteadyThroughput(
            cfg.throughput_warmup_steps, timed=self.total_steps - start_step - profiled
        )
        self.compiles = CompileWatch(cfg.compile)
        finished = False
        try:
            train_time, stopped_by = self.train(bar, stop)
            finished = True
        finally:
            # after a failed collective the group may be broken: wait for nothing
            stop.close(wait=finished)
            bar.close()
        if stopped_by:
            self.metrics.close()
            log.info(
                f"stopped by signal {stopped_by} after step {self.step}; checkpoint "
                f"{self.checkpoint_path}"
            )
            return {
                "preempted": stopped_by,
                "steps": self.step,
                "checkpoint": str(self.checkpoint_path),
            }
        return self.finish(train_time, (self.step - start_step) * cfg.batch_size)

    def check_ranks_agree(self) -> None:
        """Ranks that would take different numbers of steps hang in a collective one of them never
        reaches: compare what each rank is about to do once, before training, and say what
        differs."""
        mine = {
            "steps per epoch": self.steps_per_epoch,
            "total steps": self.total_steps,
            "first step": self.step,
            "parameters": self.num_parameters,
            "training samples": len(self.train_set),
        }
        everyone = self.rt.all_gather_object(mine)
        for key in mine:
            values = [theirs[key] for theirs in everyone]
            if len(set(values)) > 1:
                raise RuntimeError(
                    f"ranks disagree on {key}: "
                    + ", ".join(f"rank {r} has {v}" for r, v in enumerate(values))
                )

    def train(self, bar, stop: StopRequest) -> tuple[float, int]:
        """Train to ``total_steps``; returns (seconds spent training, the signal all ranks stopped
        for or 0)."""
        loss = LossWindow(self.rt.device)
        train_time = 0.0
        epoch = self.schedule.epoch_of(self.step)
        while not self.schedule.done(self.step):
            # after a resume, the loader continues where the checkpoint stood
            self.rt.set_epoch(self.loader, epoch)
            started = time.perf_counter()
            self.throughput.restart()
            batches = self.profile.timed(self.loader)  # (each wait for a batch timed)
            for _, sync, batch in iterate_steps(batches, self.cfg.grad_accum):
                self.about_to_train(batch)
                loss.add(self.train_step(batch, sync) / self.cfg.grad_accum)
                if not sync:
                    continue
                self.optimizer_step()
                self.after_step(epoch, loss, bar)
                signum = stop.agreed()
                # every rank agreed at this same step: checkpoint here, never in the handler
                if signum:
                    train_time += time.perf_counter() - started
                    if self.saved_step != self.step:
                        self.save(epoch)
                    return train_time, signum
                if self.schedule.done(self.step):
                    break
            train_time += time.perf_counter() - started
            # before this epoch's evaluation and checkpoint
            self.train_peak_rss_mb = peak_rss_megabytes()
            if self.schedule.epoch_ends(self.step):
                self.end_epoch(epoch, bar)
            epoch += 1
        return train_time, 0

    def about_to_train(self, batch: dict) -> None:
        """A micro-batch is about to train: counted for throughput and FLOPs, and for a resume's
        check."""
        self.step_tokens += count_tokens(batch)
        self.step_shapes.append((rows(batch), padded_length(batch)))
        if self.flop_template is None:
            self.flop_template = batch
        if self.continuity_check:  # the samples the first resumed step really trains
            self.continuity_check.saw(batch)

    def after_step(self, epoch: int, loss: LossWindow, bar) -> None:
        """What follows each optimizer step, in this order: a resume's continuity check, throughput,
        the loss log, a checkpoint, the step-end hooks (the tests' fault injection)."""
        if self.continuity_check:
            self.report_continuity(loss.sum)
        self.throughput.step(self.cfg.batch_size, self.step_tokens, self.step_shapes)
        self.step_tokens, self.step_shapes = 0, []
        loss.steps += 1
        bar.update(1)
        if self.schedule.should_log(self.step):
            self.log_loss(epoch, loss, bar)
        if self.schedule.should_save(self.step):
            self.save(epoch)
            self.throughput.restart()
        for hook in self.step_end_hooks:
            hook(self.rt.rank, self.step)
        self.profile.step_ended(self.step)

    def log_loss(self, epoch: int, loss: LossWindow, bar) -> None:
        mean_loss = loss.take_mean(self.rt)
        lr = self.scheduler.get_last_lr()[0]
        self.metrics.log(self.step, epoch=epoch, loss=mean_loss, lr=lr)
        self.last_logged = {"step": self.step, "value": mean_loss}
        bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}")

    def end_epoch(self, epoch: int, bar) -> None:
        """An epoch (or training) ended: evaluate the dev split if the schedule says so, then
        checkpoint."""
        if self.schedule.should_evaluate(self.step):
            dev = self.evaluate("dev")
            self.metrics.log(
                self.step, epoch=epoch, dev_accuracy=dev.accuracy, dev_macro_f1=dev.macro_f1
            )
            if self.rt.is_main and self.cfg.progress:
                bar.write(
                    f"epoch {epoch}: dev accuracy {dev.accuracy:.4f}, macro-F1 {dev.macro_f1:.4f}"
                )
        # (a periodic save may have written this very step already)
        if self.saved_step != self.step:
            self.save(epoch)

    def evaluate(self, split: str):
        # its own collate: a text's n-grams are looked up in its own split
        dataset = self.eval_sets[split]
        return evaluate(
            self.rt,
            self.model,
            dataset,
            self.data.label_names,
            self.cfg.eval_batch_size,
            getattr(dataset, "collate", None),
        )

    def finish(self, train_time: float, samples: int) -> dict:
        cfg, rt = self.cfg, self.rt
        if cfg.eval_split not in self.eval_sets:
            raise ConfigError(f"eval_split={cfg.eval_split!r} is empty for this data")
        result = self.evaluate(cfg.eval_split)
        # (training peak, overall peak) per rank; the overall one includes checkpoint gathers.
        peak_rss_mb = rt.all_gather_object((self.train_peak_rss_mb, peak_rss_megabytes()))
        # Why: each rank counted only its own shard's tokens.
        tokens = int(
            rt.all_reduce(torch.tensor(self.throughput.tokens, device=rt.device), "sum").item()
        )
        flops = utilisation(
            rt, self.flop_counter, self.flop_template, self.throughput, devices(self.model)
        )
        window = self.throughput.seconds / self.throughput.steps if self.throughput.steps else None
        breakdown = self.profile.breakdown(self.model, rt.device.type, window)
        summary = {
            "strategy": cfg.strategy,
            "world_size": rt.world_size,
            "library_world_size": rt.strategy.library_world_size,
            "precision": cfg.precision,
            "device": str(rt.device),  # what a run on a GPU machine really trained on
            "model": cfg.model.name,
            "parameters": self.num_parameters,
            "train_samples": len(self.train_set),
            "eval_split": cfg.eval_split,
            "eval_samples": result.samples,
            "accuracy": result.accuracy,
            "macro_f1": result.macro_f1,
            "weighted_f1": result.weighted_f1,
            "steps": self.step,
            "train_s": round(train_time, 3),
            "peak_rss_mb": peak_rss_mb,
            "prefetched_tensors": rt.prefetch.taken,  # copied to the device a batch ahead (CUDA)
            "samples_per_s": round(samples / train_time, 2) if train_time > 0 else None,
            **self.throughput.rates(tokens),
            **self.compiles.summary(),
            **flops,
            "breakdown": breakdown,
            "checkpoint": str(self.checkpoint_path) if self.checkpoint_path else None,
            "run_dir": str(self.run_dir.root),
            "launch_id": os.environ.get(LAUNCH_ID),  # which launching process's workers wrote this
        }
        if rt.is_main:
            self.metrics.log(
                self.step, **{f"{cfg.eval_split}_{k}": summary[k] for k in ("accuracy", "macro_f1")}
            )
            title = f"{cfg.eval_split} report: {cfg.strategy} x{rt.world_size}, {cfg.model.name}"
            write_results(self.run_dir, result, self.data.label_names, summary, title)
        self.metrics.close()
        return summary


def run_training(
    cfg: TrainConfig,
    data: PreparedData,
    run_dir: str | Path,
    step_end_hooks: Sequence[Callable[[int, int], None]] = (),
) -> dict:
    """Train and evaluate in this process (one rank of the job); always tears the process group
    down."""
    # The strategy gets its own options section, nothing else of the configuration.
    with setup(
        cfg.strategy,
        cfg.precision,
        seed=cfg.seed,
        options=cfg.strategy_options(),
        timeout_s=cfg.launch.timeout_s,
    ) as rt:
        return Trainer(cfg, data, Path(run_dir), rt, step_end_hooks).fit()
