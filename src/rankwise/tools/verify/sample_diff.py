"""Why the samples of the two runs do not match: the same dataset index, other tensors.

The one process takes, batch by batch, the dataset indices the N ranks took together
(:mod:`rankwise.tools.watch.loaders`), and every pass records its first samples' indices with their
digests.  So where the digests do not match, the index says whether the *data* differs (index i is
another tensor in the one process than on the rank that took it: the dataset is made differently in
each process) or only the order.
"""

from __future__ import annotations

from rankwise.tools.watch.records import PassRecord, RankRecord


def _by_index(records: list[RankRecord]) -> dict[tuple[int, int], tuple[int, str, PassRecord]]:
    """Each training sample's (loader, index) -> (rank, digest, the pass it came from), from the
    runs' records."""
    seen: dict[tuple[int, int], tuple[int, str, PassRecord]] = {}
    for record in records:
        for p in record["passes"]:
            if p["trained"]:
                for index, digest in p.get("sample_indices", []):
                    seen.setdefault((p["loader"], index), (record["rank"], digest, p))
    return seen


def unmatched_samples(candidate: list[RankRecord], reference: list[RankRecord]) -> str | None:
    """What differs between the runs' samples, with the likely cause; ``None`` where no index
    tells."""
    ranks, one = _by_index(candidate), _by_index(reference)
    shared = sorted(set(ranks) & set(one))
    differing = [index for index in shared if ranks[index][1] != one[index][1]]
    if not differing:
        return None
    (_, index) = differing[0]
    rank, _, taken = ranks[differing[0]]
    dataset = taken.get("dataset") or {}
    places = (
        [f"defined at {dataset['defined_at']}"]
        if dataset.get("defined_at") and not dataset.get("module", "").startswith("torch.")
        else []
    )
    if taken.get("site"):
        places.append(f"its DataLoader built at {taken['site']}")
    where = f" ({', '.join(places)})" if places else ""
    return (
        f"the same dataset index gives different tensors: index {index} on rank {rank} is not "
        f"index {index} in the one process ({len(differing)} of the {len(shared)} indices both "
        "runs recorded differ). The data itself differs from process to process, not only its "
        f"order: the dataset {dataset.get('class', '?')}{where} is made differently in each "
        "process — random data drawn without a seed in each process (seed before building it, or "
        "build it once and load it), per-rank files, or random augmentation in __getitem__"
    )
