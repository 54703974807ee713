"""The commands a page shows: the lines of its ```bash / ``` code blocks, continuations joined,
comments dropped."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def code_blocks(page: Path, languages: tuple[str, ...] = ("", "bash")) -> list[str]:
    """The text of every fenced code block of ``page`` in one of ``languages`` ('' = no language
    named)."""
    return [
        body
        for language, body in BLOCK.findall(page.read_text(encoding="utf-8"))
        if language in languages
    ]


def commands(page: Path) -> list[list[str]]:
    """Every command line in ``page``'s shell code blocks, split as the shell would, without its
    comment."""
    found = []
    for block in code_blocks(page):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                found.append(words)
    return found


def rankwise_commands(page: Path) -> list[list[str]]:
    """The ``rankwise ...`` command lines of ``page``, without the leading ``rankwise``."""
    return [words[1:] for words in commands(page) if words[0] == "rankwise"]
