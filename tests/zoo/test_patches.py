"""cpu.patch handling: a hunk without a `zoo:` line is named, a patch that no longer matches its
original is refused (no fuzz), and a patch the runner writes applies back, end-of-file included."""

from __future__ import annotations

import pytest

from tests.support.zoo import runner

patches = runner("patches")

MIDDLE = "".join(f"x{i} = {i}\n" for i in range(10))
ORIGINAL = {"s.py": f"import torch\n\ndevice = 'cuda'\n{MIDDLE}last = 7"}


def edited(**lines: str) -> dict[str, str]:
    text = ORIGINAL["s.py"]
    for old, new in lines.items():
        text = text.replace(old, new)
    return {"s.py": text}


def test_a_patch_made_from_an_edited_copy_applies_back_exactly():
    copy = edited(
        **{"device = 'cuda'": "# zoo: no GPU\ndevice = 'cpu'", "last = 7": "# zoo: end\nlast = 8"}
    )
    text = patches.make(ORIGINAL, copy)
    assert patches.NO_NEWLINE in text  # the original's last line has no newline
    files = patches.parse(text)
    assert [len(f.hunks) for f in files] == [2]
    assert patches.unexplained(files) == []
    assert patches.apply(ORIGINAL, files) == copy


def test_a_hunk_that_does_not_say_why_is_named():
    text = patches.make(ORIGINAL, edited(**{"device = 'cuda'": "device = 'cpu'"}))
    assert patches.unexplained(patches.parse(text)) == ["s.py: hunk @@ -1"]


def test_a_patch_whose_context_moved_is_refused():
    text = patches.make(ORIGINAL, edited(**{"last = 7": "# zoo: end\nlast = 8"}))
    moved = {"s.py": "# a new first line\n" + ORIGINAL["s.py"]}
    with pytest.raises(patches.PatchError, match="s.py: hunk @@ -11 does not apply"):
        patches.apply(moved, patches.parse(text))


def test_a_patch_of_a_file_the_case_does_not_hold_is_refused():
    text = patches.make(ORIGINAL, edited(**{"x1 = 1": "# zoo: why\nx1 = 2"})).replace(
        "s.py", "t.py"
    )
    with pytest.raises(patches.PatchError, match="t.py: the patch changes a file"):
        patches.apply(ORIGINAL, patches.parse(text))
