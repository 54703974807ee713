"""The documentation tier (``make test-docs``): every command block of README.md and docs/ runs as
written in CI, or says why it cannot, and the README's demo runs in CI at the smoke preset.

The blocks themselves run in ``make test-docs`` (pytest-codeblocks with
``tests/support/docs/codeblocks.py``); these tests check that nothing escapes it (a block whose
language the tool does not run, a skip without a reason), that CI calls it, and what the plugin
adds to the tool."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_codeblocks import extract_from_file

from tests.support.cli import ROOT, command_env
from tests.support.docs.codeblocks import STAND_INS, YOURS

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN = ("bash", "sh", "python")
"""The languages pytest-codeblocks runs."""
FENCE = re.compile(r"^```(.*)$")
MARKS = re.compile(r"^pytest\.mark\.(skip|exits|timeout)\((.*)\)\s*$")
"""The markers a page may put on a block: skip and exits with a reason, a longer timeout."""


def blocks() -> list[tuple[Path, object]]:
    return [(page, block) for page in PAGES for block in extract_from_file(page)]


def _name(page: Path, block) -> str:
    return f"{page.relative_to(ROOT)}:{block.lineno}"


def test_every_code_block_names_its_language():
    """A bare fence is neither run nor skipped: the tool sees only ```bash, ```sh and ```python.
    A command is ```bash; what a command prints is ```text."""
    bare = []
    for page in PAGES:
        inside = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            fence = FENCE.match(line.strip())
            if fence:
                if not inside and not fence.group(1).strip():
                    bare.append(f"{page.relative_to(ROOT)}:{number}")
                inside = not inside
    assert not bare, f"blocks without a language (```bash: a command, ```text: output): {bare}"


def test_a_block_not_run_says_why_and_none_accepts_a_failure():
    for page, block in blocks():
        for mark in block.marks:
            found = MARKS.match(mark.strip())
            assert found, f"{_name(page, block)}: {mark!r} (skip or exits, with a reason)"
            kind, arguments = found.groups()
            if kind in ("skip", "exits"):
                assert re.search(r'reason="[^"]{10,}"', arguments), (
                    f"{_name(page, block)}: {mark!r} says no reason a reader can see"
                )


def test_most_documented_commands_run_and_the_readme_s_main_ones_do():
    runnable = [
        (page, block)
        for page, block in blocks()
        if block.syntax in RUN and not any("skip" in mark for mark in block.marks)
    ]
    assert len(runnable) >= 20, len(runnable)
    readme = "".join(block.code for page, block in runnable if page.name == "README.md")
    for command in ("rankwise launch", "rankwise bench --script", "rankwise verify"):
        assert command in readme, command
    for command in ("rankwise plan", "rankwise train"):
        assert command in readme, command


def test_ci_runs_the_documentation_tier_and_the_readme_s_demo_at_the_smoke_preset():
    steps = [
        line.strip()
        for line in (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
        if line.strip().startswith("make ")
    ]
    assert steps == ["make test", "make test-docs", "make demo DEMO_PRESET=smoke"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = re.search(r"^test-docs: \$\(STAMP\)\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target, "make test-docs: its set-up (the $(STAMP) prerequisite) and its recipe"
    recipe = target.group(1).replace("\\\n", " ")
    # (a page's blocks in order on one worker: --dist loadfile)
    parts = (
        "-p tests.support.docs.codeblocks",
        "--codeblocks",
        "--dist loadfile",
        "README.md docs",
    )
    for part in parts:
        assert part in recipe, part
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"pytest-codeblocks==0.18.0"' in pyproject


def test_every_stand_in_for_a_users_file_exists():
    assert {(YOURS / source).is_file() for source in STAND_INS.values()} == {True}


def _run_page(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.docs.codeblocks", "--codeblocks"]
        + ["-p", "no:xdist", "-p", "no:cacheprovider", "-q", "-rA", str(page)],
        cwd=ROOT,
        env=command_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.multiproc
def test_blocks_run_in_order_in_a_copy_of_the_repository_at_the_smoke_size(tmp_path):
    where = tmp_path / "where.txt"
    proc = _run_page(
        tmp_path,
        f"""# A page

```bash
test "$RANKWISE_SMOKE" = 1
test "$(command -v rankwise)" = "{Path(sys.executable).parent / "rankwise"}"
test -f README.md && test -f train.py && test -f my.csv && test -d .venv
pwd > {where}
echo written > from-the-first-block.txt
```

```bash
test "$(cat from-the-first-block.txt)" = written
```
""",
    )
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:]
    copy = Path(where.read_text(encoding="utf-8").strip())
    assert copy != ROOT and not copy.exists(), "the copy is removed at the end"
    assert not (ROOT / "from-the-first-block.txt").exists(), "the checkout is left as it was"


@pytest.mark.multiproc
def test_any_failing_line_fails_its_block_and_a_documented_exit_status_is_held(tmp_path):
    proc = _run_page(
        tmp_path,
        """# A page

```bash
false
true
```

<!-- pytest.mark.exits(3, reason="documented: the command exits 3") -->
```bash
echo before; exit 3
```

<!-- pytest.mark.exits(3, reason="documented: the command exits 3") -->
```bash
true
```

```bash
echo on-stderr >&2
exit 2
```
""",
    )
    out = proc.stdout
    assert proc.returncode == 1 and "3 failed, 1 passed" in out, out[-3000:]
    # the tool alone passes the first block (its last line succeeds) and reports only a number
    assert "the block at line 3 exited 1 (the page documents 0):\nfalse\ntrue" in out
    assert "the block at line 14 exited 0 (the page documents 3)" in out
    assert "the block at line 18 exited 2 (the page documents 0)" in out and "on-stderr" in out
