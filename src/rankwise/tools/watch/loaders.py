"""The watcher's view of the data: every DataLoader pass, each batch's samples and dataset indices,
set_epoch calls.

After ``rankwise verify``'s compared window the N-rank run goes on through the rest of the script;
to get there in bounded time each training pass is cut short (:meth:`LoaderWatch.shorten`): a pass
that trained yields at most a few more batches, then ends as if its data had run out, so the script
walks through every epoch, its evaluation and its saves.  A pass that never trained (evaluation)
runs whole.

In the reference run (``scale`` > 1: one process standing in for N ranks) each training DataLoader
the script builds takes N times its batch, and, batch by batch, the dataset indices the N ranks took
together in the same step (from their records): so its step t trains on exactly the N ranks' step-t
samples, whatever order the framework's sampler would have drawn at world size 1.
"""

from __future__ import annotations

import inspect
import json
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.data.dataloader import _BaseDataLoaderIter

from rankwise.sampling.batching import dataset_size
from rankwise.sampling.samples import batch_rows, sample_digests, token_count
from rankwise.tools.watch.ranks import call_site, patch
from rankwise.tools.watch.records import DatasetDescription, PassRecord

RANK_RECORD = "watch-rank{rank}.json"


class _Pass:
    """One pass over a DataLoader on this rank."""

    def __init__(self, loader: DataLoader[Any], number: int, length: int | None) -> None:
        sampler = getattr(loader, "sampler", None)
        batch_sampler = getattr(loader, "batch_sampler", None)
        inner = (
            getattr(batch_sampler, "sampler", None)
            if not isinstance(sampler, DistributedSampler)
            else sampler
        )
        distributed = next(
            (
                s
                for s in (sampler, inner, getattr(batch_sampler, "batch_sampler", None))
                if isinstance(s, DistributedSampler)
            ),
            None,
        )
        try:
            size = dataset_size(loader.dataset)
        except TypeError:
            size = None
        self.record: PassRecord = {
            "loader": number,
            "dataset_size": size,
            "batch_size": loader.batch_size,
            "sampler": _sampler_name(sampler, batch_sampler),
            "distributed_sampler": distributed is not None,
            "shuffle": bool(getattr(distributed, "shuffle", False)) if distributed else None,
            "epoch": getattr(distributed, "epoch", None) if distributed else None,
            "samples": 0,
            "trained": 0,
            "first": [],
            "complete": False,
            "site": None,
            "cut_after": None,
            "batches": length,
            "dataset": _described(loader.dataset),
            "collectives_at_start": (0, 0, 0),
            "collectives_after": None,
            "deduplicated_after": None,
            "trimmed_after": None,
            "sample_indices": [],
        }
        self.pending: deque[tuple[list[str], int | None]] = deque()
        """Batches yielded that no backward consumed yet: their digests and tokens."""
        self.last_yield = 0
        self.done = False
        """The pass ended (a framework may have read past its last batch before training on it)."""
        self.fetching: deque[list[int] | None] = deque()
        """The dataset indices of the batches the loader's iterator asked for and has not yielded
        yet."""
        self.indices: list[list[int] | None] = []
        """Each yielded batch's dataset indices (map-style datasets), for the reference to take the
        same."""
        self.cut_from = 0
        """Batches the pass had trained on when the cutting began (0: it began after)."""


class LoaderWatch:
    def __init__(
        self,
        *,
        scale: int = 1,
        follow: Path | None = None,
        on_batch: Callable[[], None] = lambda: None,
        digest_all: bool = True,
        collectives: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0),
    ) -> None:
        self.scale, self.on_batch, self.digest_all = scale, on_batch, digest_all
        self.loaders: dict[int, int] = {}
        """id(loader) -> its number."""
        self.lineage: dict[tuple[int, int], tuple[int, weakref.ref[object]]] = {}
        """(id(dataset), id(sampler)) -> the number of the loader first built over them: a
        framework that builds a new DataLoader over the same sampler each epoch (DeepSpeed's
        DeepSpeedDataLoader) runs one loader's passes, not a new loader each."""
        self.passes: list[_Pass] = []
        self.active: dict[int, _Pass] = {}
        self.sites: dict[int, str] = {}
        """id(loader) -> the line that built it (the script's, not a framework's re-creation)."""
        self.scaled: dict[int, int] = {}
        """id(dataset) -> the batch size the reference gave its loader (a framework re-creating it
        keeps it)."""
        self.unscaled: list[str] = []
        self.set_epoch_calls = 0
        self.pass_counts: dict[int, int] = {}
        self.yields = 0
        self._iterating: tuple[int, int] | None = None
        # (under None: indices fetched outside any pass the watcher saw start)
        self._early: dict[tuple[int, int] | None, deque[list[int] | None]] = {}
        self.given = trained_indices(follow) if follow is not None else {}
        """In a following reference: (loader, pass) -> the indices of each batch the N ranks trained
        on together."""
        self.keep: int | None = None
        """After the compared window: the batches a training pass yields before it is cut (``None``:
        as written)."""
        self.training: set[int] = set()
        """The loaders a backward consumed a batch of."""
        self.consumed_batches = 0
        """Batches a backward consumed (in the window: its micro-batches per step)."""
        self._length = DataLoader.__len__
        """A loader's own length (a cut training loader's is ``keep``: what it will yield)."""
        self.waited = 0.0
        """Seconds the script waited for a batch since :meth:`take_wait_seconds` (the loader's
        fetch: its dataset, collate, workers), for a benchmark's every timed step."""
        self.collectives = collectives
        """The data-carrying collectives, ``gather_for_metrics`` calls and rows cut off gathered
        tensors so far (each pass notes them at its start: was an evaluation combined after it,
        were its repeats dropped?)."""

    def install(self) -> None:
        patch(DataLoader, "__init__", self._loader_init)
        patch(DataLoader, "__iter__", self._loader_iter)
        patch(DataLoader, "__len__", self._loader_len)
        patch(_BaseDataLoaderIter, "_next_index", self._next_index)
        patch(DistributedSampler, "set_epoch", self._set_epoch)

    def consume(self) -> tuple[list[str], int | None] | None:
        """The batch a backward consumed: the oldest one the loader being iterated yielded and no
        backward took (a framework may have fetched the next one already, or read past the pass's
        end)."""
        feeding = [p for p in self.active.values() if p.pending and not p.done] or [
            p for p in self.active.values() if p.pending
        ]
        if not feeding:
            return None
        current = max(feeding, key=lambda p: p.last_yield)
        self.consumed_batches += 1
        self.training.add(current.record["loader"])
        digests, tokens = current.pending.popleft()
        current.record["trained"] += len(digests)
        current.record["trained_batches"] = current.record.get("trained_batches", 0) + 1
        return digests, tokens

    def batch_waiting(self) -> bool:
        """Whether a yielded batch waits for the backward that consumes it (its digests are the
        step's samples: the model's inputs need no digest of their own)."""
        return any(p.pending for p in self.active.values())

    def take_wait_seconds(self) -> float:
        """The seconds waited for batches since the last call (one step's)."""
        waited, self.waited = self.waited, 0.0
        return waited

    def digest_first_only(self) -> None:
        """From here on, each pass digests its first batches only (the traced window is over: the
        findings read each pass's first samples and its counts)."""
        self.digest_all = False

    def batches_from_runtime(self) -> None:
        """A Runtime's loaders give one process the N ranks' global batches themselves: nothing to
        hand them from the N-rank run."""
        self.given = {}

    def shorten(self, keep: int) -> None:
        """From now on each pass that trains yields at most ``keep`` more batches, then ends.  Every
        rank calls this at the same step, and counts from the batches it trained on (not those a
        loader fetched ahead), so every rank cuts at the same batch and no collective is left
        unmatched."""
        self.keep = keep
        for current in self.active.values():
            current.cut_from = current.record.get("trained_batches", 0)

    def records(self) -> list[PassRecord]:
        passes: list[PassRecord] = [
            p.record | {"indices": p.indices[: p.record.get("trained_batches", 0)]}
            for p in self.passes
        ]
        for at, this in enumerate(passes):
            # What the script combined from this pass's start to the next training pass (or the
            # end).
            after = next((p for p in passes[at + 1 :] if p["trained"]), None)
            end = after["collectives_at_start"] if after else self.collectives()
            this["collectives_after"] = end[0] - this["collectives_at_start"][0]
            this["deduplicated_after"] = end[1] - this["collectives_at_start"][1]
            this["trimmed_after"] = end[2] - this["collectives_at_start"][2]
        return passes

    def _loader_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)
        watcher = self

        def init(loader: DataLoader[Any], *args: Any, **kwargs: Any) -> None:
            site = call_site()
            if site != "?":
                watcher.sites[id(loader)] = site
            bound = signature.bind(loader, *args, **kwargs)
            arguments = bound.arguments
            dataset = arguments.get("dataset")
            batch_size = arguments.get("batch_size", 1)
            if (
                watcher.scale > 1
                and arguments.get("batch_sampler") is None
                and isinstance(batch_size, int)
            ):
                # a framework re-creating a scaled loader keeps it
                if watcher.scaled.get(id(dataset)) != batch_size:
                    arguments["batch_size"] = batch_size * watcher.scale
                    watcher.scaled[id(dataset)] = batch_size * watcher.scale
            elif (
                watcher.scale > 1
                and arguments.get("batch_sampler") is not None
                and id(dataset) not in watcher.scaled
            ):
                if site != "?":  # built by the script, not re-created by a framework
                    watcher.unscaled.append(f"{site}: a DataLoader with its own batch_sampler")
            return original(*bound.args, **bound.kwargs)

        return init

    def _loader_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        def iterate(loader: DataLoader[Any]) -> Iterator[Any]:
            number = watcher.number(loader)
            key = (number, watcher.pass_counts.get(number, 0))
            watcher.pass_counts[number] = key[1] + 1
            current = _Pass(loader, number, _length(watcher._length, loader))
            current.record["site"] = watcher.sites.get(id(loader))
            for ended in [n for n, p in watcher.active.items() if p.done]:
                del watcher.active[ended]  # what an ended pass left untrained stays so
            # a loader with workers asks for its first batches while it starts
            watcher._iterating = key
            try:
                batches = original(loader)
            finally:
                watcher._iterating = None
            if isinstance(batches, _BaseDataLoaderIter):
                # our mark on torch's iterator: which pass it serves
                batches._rankwise_pass = (key, current)  # type: ignore[attr-defined]
            return watcher._batches(current, key, batches)

        return iterate

    def number(self, loader: DataLoader[Any]) -> int:
        """The loader's number: its own, else that of an earlier loader over the same dataset and
        sampler objects (the samplers a DataLoader makes itself are new objects each time)."""
        if id(loader) not in self.loaders:
            sampler = getattr(loader, "sampler", None)
            lineage = (id(loader.dataset), id(sampler))
            number, earlier = self.lineage.get(lineage, (-1, None))
            # (the same sampler object still alive, not another one at a freed one's address)
            if earlier is None or earlier() is not sampler:
                number = max(self.loaders.values(), default=-1) + 1
                try:
                    self.lineage[lineage] = (number, weakref.ref(sampler))
                except TypeError:  # (a sampler without weak references: no lineage)
                    pass
            self.loaders[id(loader)] = number
        return self.loaders[id(loader)]

    def _loader_len(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        def length(loader: DataLoader[Any]) -> int:
            batches = original(loader)
            if watcher.keep is not None and watcher.loaders.get(id(loader)) in watcher.training:
                # A framework that reads an epoch's length (Lightning: whether this batch is the
                # last) sees the cut.
                return min(batches, watcher.keep)
            return batches

        return length

    def _next_index(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        def next_index(iterator: _BaseDataLoaderIter) -> Any:
            key, current = getattr(iterator, "_rankwise_pass", (watcher._iterating, None))
            given = watcher.given.get(key) if key is not None else None
            position = getattr(iterator, "_rankwise_position", 0)
            if given is not None and position < len(given):
                # The reference takes the samples the N ranks trained on together in this batch.
                original(iterator)  # (the loader's own sampler moves on, as it would)
                indices = given[position]
            else:
                indices = original(iterator)
            # ignore[attr-defined]: our count on torch's iterator, of the batches it asked for
            iterator._rankwise_position = position + 1  # type: ignore[attr-defined]
            if current is not None:
                current.fetching.append(
                    list(indices) if isinstance(indices, (list, tuple)) else None
                )
            else:
                watcher._early.setdefault(key, deque()).append(
                    list(indices) if isinstance(indices, (list, tuple)) else None
                )
            return indices

        return next_index

    def _batches(
        self, current: _Pass, key: tuple[int, int], batches: Iterable[Any]
    ) -> Iterator[Any]:
        number = current.record["loader"]
        current.fetching.extend(self._early.pop(key, ()))
        current.record["collectives_at_start"] = self.collectives()
        batches = iter(batches)
        self.passes.append(current)
        self.active[number] = current
        try:
            while True:
                if self._cut(current):
                    # Ends the pass here, as if its data had run out: every rank stops at the same
                    # batch.
                    current.record["cut_after"] = len(current.indices)
                    break
                fetching = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    current.record["complete"] = True
                    break
                finally:
                    self.waited += time.perf_counter() - fetching
                current.indices.append(current.fetching.popleft() if current.fetching else None)
                # Every sample's digest for a trace; for a benchmark only the first few (the
                # sharding check), the rest counted.
                digests = (
                    sample_digests(batch)
                    if self.digest_all or len(current.record["first"]) < 8
                    else [""] * batch_rows(batch)
                )
                current.record["samples"] += len(digests)
                if len(current.record["first"]) < 8:
                    current.record["first"] += digests[: 8 - len(current.record["first"])]
                if len(current.record["sample_indices"]) < 8 and current.indices[-1] is not None:
                    current.record["sample_indices"] += list(
                        zip(current.indices[-1], digests, strict=False)
                    )[: 8 - len(current.record["sample_indices"])]
                if (
                    current.record["batches"] is not None
                    and len(current.indices) >= current.record["batches"]
                ):
                    # its last batch (a framework may never ask past it)
                    current.record["complete"] = True
                current.pending.append((digests, token_count(batch)))
                self.yields += 1
                current.last_yield = self.yields
                self.on_batch()
                yield batch
        finally:
            current.done = True

    def _cut(self, current: _Pass) -> bool:
        """Whether a pass that trains (or a later pass of a loader that trained) has yielded its
        ``keep`` batches since the cutting began."""
        trains = current.record["trained"] > 0 or current.record["loader"] in self.training
        return (
            self.keep is not None
            and trains
            and len(current.indices) >= current.cut_from + self.keep
        )

    def _set_epoch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        def set_epoch(sampler: DistributedSampler[Any], epoch: int) -> None:
            watcher.set_epoch_calls += 1
            return original(sampler, epoch)

        return set_epoch


def _sampler_name(sampler: object, batch_sampler: object) -> str | None:
    """The sampler that orders the pass: a batch sampler of a framework's own (Accelerate's
    ``BatchSamplerShard``) orders it with the sampler inside it, not with the loader's default
    ``sampler`` attribute."""
    if batch_sampler is None or getattr(batch_sampler, "sampler", None) is sampler:
        return type(sampler).__name__ if sampler is not None else None
    inner = getattr(batch_sampler, "sampler", None) or getattr(
        getattr(batch_sampler, "batch_sampler", None), "sampler", None
    )
    return (
        f"{type(inner).__name__} in {type(batch_sampler).__name__}"
        if inner is not None
        else type(batch_sampler).__name__
    )


def _length(length: Callable[[DataLoader[Any]], int], loader: DataLoader[Any]) -> int | None:
    try:
        return length(loader)
    except TypeError:  # an iterable dataset without a length
        return None


def _described(dataset: object) -> DatasetDescription:
    """The dataset's class and where it is defined (the script's own class: where its data is
    made)."""
    kind = type(dataset)
    try:
        source = inspect.getsourcefile(kind)
        where = f"{Path(source).name}:{inspect.getsourcelines(kind)[1]}" if source else None
    except (TypeError, OSError):
        where = None
    return {"class": kind.__name__, "defined_at": where, "module": kind.__module__}


def trained_indices(directory: Path) -> dict[tuple[int, int], list[list[int]]]:
    """From the N-rank run's records: each training pass's batches, every rank's indices of batch i
    together."""
    records = [
        json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(Path(directory).glob(RANK_RECORD.format(rank="*")))
    ]
    records.sort(key=lambda record: record["rank"])
    given: dict[tuple[int, int], list[list[int]]] = {}
    for record in records:
        counts: dict[int, int] = {}
        for entry in record["passes"]:
            key = (entry["loader"], counts.get(entry["loader"], 0))
            counts[entry["loader"]] = key[1] + 1
            batches = entry.get("indices") or []
            if not entry["trained"] or not batches or any(batch is None for batch in batches):
                continue
            together = given.setdefault(key, [])
            for i, batch in enumerate(batches):
                if i < len(together):
                    together[i] = together[i] + batch
                else:
                    together.append(list(batch))
    return given
