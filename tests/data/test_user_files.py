import json

import pytest

from rankwise.data.records import DataError
from rankwise.data.user_files import read_file


def write(path, content: str | bytes):
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def test_csv_with_chinese_labels_and_quoted_fields(tmp_path):
    f = write(
        tmp_path / "emo.csv",
        'text,label\n"今天很开心, 真的",高兴\n这部电影太差了,愤怒\n\n一般般,其他\n',
    )
    records = read_file(f)
    assert [(r.text, r.label) for r in records] == [
        ("今天很开心, 真的", "高兴"),
        ("这部电影太差了", "愤怒"),
        ("一般般", "其他"),
    ]
    assert records[2].source.endswith("emo.csv:5")


def test_tsv_with_custom_columns_and_split(tmp_path):
    f = write(
        tmp_path / "d.tsv",
        "id\tcontent\temotion\tpart\n1\t好\t喜好\ttrain\n2\t坏\t厌恶\tvalidation\n",
    )
    records = read_file(f, text_column="content", label_column="emotion", split_column="part")
    assert [(r.text, r.label, r.split) for r in records] == [
        ("好", "喜好", "train"),
        ("坏", "厌恶", "dev"),
    ]


def test_jsonl(tmp_path):
    lines = [
        json.dumps({"text": "很好", "label": "pos"}, ensure_ascii=False),
        "",
        json.dumps({"text": "差", "label": 0}),
    ]
    records = read_file(write(tmp_path / "d.jsonl", "\n".join(lines) + "\n"))
    assert [(r.text, r.label) for r in records] == [("很好", "pos"), ("差", "0")]


@pytest.mark.parametrize(
    "name, content, kwargs, message",
    [
        (
            "short.csv",
            "text,label\nok,a\nonly-one-field\n",
            {},
            r"short.csv:3: malformed row: 1 fields, the header has 2",
        ),
        ("long.tsv", "text\tlabel\nok\ta\nx\ty\tz\n", {}, r"long.tsv:3: malformed row: 3 fields"),
        (
            "cols.csv",
            "sentence,target\na,b\n",
            {},
            r"cols.csv:1: missing column\(s\) 'text', 'label'.*'sentence', 'target'",
        ),
        ("empty.csv", "", {}, r"empty.csv: the file is empty"),
        ("header.csv", "text,label\n", {}, r"header.csv: no data rows"),
        ("nolabel.csv", "text,label\nfine,a\nhmm,\n", {}, r"nolabel.csv:3: empty label"),
        (
            "bad.jsonl",
            '{"text": "a", "label": "b"}\n{"text": "a", "label": \n',
            {},
            r"bad.jsonl:2: malformed JSON",
        ),
        (
            "key.jsonl",
            '{"text": "a", "label": "b"}\n{"txt": "a", "label": "b"}\n',
            {},
            r"key.jsonl:2: missing key 'text'",
        ),
        ("list.jsonl", '["a", "b"]\n', {}, r"list.jsonl:1: expected a JSON object"),
        (
            "split.csv",
            "text,label,s\na,b,train\nc,d,holdout\n",
            {"split_column": "s"},
            r"split.csv:3: unknown split 'holdout'",
        ),
        ("data.xlsx", "x", {}, r"data.xlsx: unsupported file type"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path, name, content, kwargs, message):
    with pytest.raises(DataError, match=message):
        read_file(write(tmp_path / name, content), **kwargs)


def test_non_utf8_names_the_line(tmp_path):
    f = write(tmp_path / "gbk.csv", b"text,label\nok,a\n" + "坏了,b\n".encode("gbk"))
    with pytest.raises(DataError, match=r"gbk.csv:3: not valid UTF-8"):
        read_file(f)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="nope.csv: file not found"):
        read_file(tmp_path / "nope.csv")
