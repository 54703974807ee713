"""rankwise speaks through `logging`: a library user can silence and capture it; the commands print
it as before."""

import logging

import pytest

from rankwise.logs import ROOT, Terminal, get_logger, this_rank, to_terminal
from rankwise.train.config import build_config
from rankwise.train.run import prepare_run


class Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def rankwise_logger():
    """The ``rankwise`` logger as a program that embeds rankwise finds it (a command run in this
    process earlier may have given it the terminal handler; conftest restores it afterwards), with a
    handler that keeps its records."""
    logger = logging.getLogger(ROOT)
    logger.handlers.clear()
    logger.setLevel(logging.NOTSET)
    logger.propagate = True
    kept = Kept()
    logger.addHandler(kept)
    return logger, kept


def _prepare_toy(tmp_path):
    """A real message path at world size 1: `rankwise train`'s preparation says what data it
    found."""
    return prepare_run(
        build_config(overrides=["data.source=toy", "data.toy_samples=200", f"out={tmp_path}"])
    )


def test_a_library_user_captures_rankwise_messages_with_a_handler(rankwise_logger, tmp_path):
    logger, kept = rankwise_logger
    logger.setLevel(logging.INFO)
    _prepare_toy(tmp_path)
    said = {record.name: record.getMessage() for record in kept.records}
    assert said["rankwise.train.run"].startswith("data: toy: train ")
    assert kept.records[0].filename == "run.py"  # the caller's file, not the rank-aware adapter's


def test_a_library_user_silences_rankwise_by_its_level(rankwise_logger, tmp_path):
    logger, kept = rankwise_logger
    logger.setLevel(logging.WARNING)
    _prepare_toy(tmp_path)
    get_logger("rankwise.example").info("an info message")
    get_logger("rankwise.example").warning("a warning")
    assert [record.getMessage() for record in kept.records] == ["a warning"]


def test_messages_come_from_rank_0_unless_every_rank_is_asked_for(rankwise_logger, monkeypatch):
    logger, kept = rankwise_logger
    logger.setLevel(logging.INFO)
    log = get_logger("rankwise.example")
    assert this_rank() == 0  # world size 1: this process is rank 0
    log.info("from rank 0")
    monkeypatch.setenv("RANK", "1")
    assert this_rank() == 1
    log.warning("rank 1, by default: not said")
    log.info("rank 1, asked for", every_rank=True)
    assert [record.getMessage() for record in kept.records] == ["from rank 0", "rank 1, asked for"]


def test_a_logger_outside_rankwise_is_refused():
    with pytest.raises(ValueError, match="not a rankwise module"):
        get_logger("rankwise_other.module")


def test_the_commands_handler_prints_what_the_commands_printed(rankwise_logger, tmp_path, capsys):
    logger, _ = rankwise_logger
    to_terminal()
    to_terminal()  # twice: still one handler
    assert (
        sum(isinstance(handler, Terminal) for handler in logger.handlers) == 1
        and not logger.propagate
    )
    _prepare_toy(tmp_path)
    (tmp_path / "result.json").write_text("{}")  # a finished run in this --out
    capsys.readouterr()
    _prepare_toy(tmp_path)
    out, err = capsys.readouterr()
    # The text `rankwise train` printed before logging, on the same streams: the data line on
    # stdout, the notes on stderr.
    data = [line for line in out.splitlines() if line.startswith("data: ")]
    assert (
        out == data[0] + "\n"
        and data[0].startswith("data: toy: train ")
        and data[0].endswith(" (0 duplicates and 0 contradictory texts removed)")
    )
    assert (
        err.splitlines()[0]
        == f"note: {tmp_path} already holds a finished run; it will be overwritten"
    )
    get_logger("rankwise.example").warning("warning: plain text on stderr")
    get_logger("rankwise.example").info("note: a note", stderr=True)
    get_logger("rankwise.example").debug("below the commands' level")
    assert capsys.readouterr() == ("", "warning: plain text on stderr\nnote: a note\n")
