from rankwise.data.records import Record
from rankwise.data.split import assign_splits, clean, hash_split


def test_clean_removes_duplicates_and_contradictions():
    records = [
        Record("a", "pos"),
        Record("a", "pos"),
        Record("b", "neg"),
        Record("c", "pos"),
        Record("c", "neg"),
        Record("d", "neg"),
    ]
    kept, stats = clean(records)
    assert [(r.text, r.label) for r in kept] == [("a", "pos"), ("b", "neg"), ("d", "neg")]
    assert stats == {
        "rows": 6,
        "duplicates_removed": 1,
        "contradictory_texts_removed": 1,
        "kept": 3,
    }


def test_hash_split_is_deterministic_and_proportional():
    texts = [f"text {i}" for i in range(20000)]
    splits = [hash_split(t, 5, 10) for t in texts]
    assert splits == [hash_split(t, 5, 10) for t in texts]
    share = {name: splits.count(name) / len(texts) for name in ("train", "dev", "test")}
    assert (
        abs(share["train"] - 0.85) < 0.01
        and abs(share["dev"] - 0.05) < 0.01
        and abs(share["test"] - 0.10) < 0.01
    )


def test_given_split_wins():
    parts = assign_splits([Record("x", "a", "test"), Record("y", "a", None)], 0, 10)
    assert [r.text for r in parts["test"]] == ["x"] + (
        ["y"] if hash_split("y", 0, 10) == "test" else []
    )
