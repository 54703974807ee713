"""The workarounds reference page is generated from ``rankwise.compat``'s records, and the
architecture page's short list of them names each one: adding a workaround without it shows here."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rankwise.compat import versions
from tests.support.cli import ROOT, command_env

pytestmark = pytest.mark.multiproc  # the generator runs in a process of its own, as mkdocs runs it


def _recorded() -> list[versions.Workaround]:
    import importlib
    import pkgutil

    import rankwise.compat

    found = []
    for info in pkgutil.iter_modules(rankwise.compat.__path__):
        module = importlib.import_module(f"rankwise.compat.{info.name}")
        found += [
            value for value in vars(module).values() if isinstance(value, versions.Workaround)
        ]
    return found


def test_every_workaround_is_on_the_generated_page_and_in_the_architecture(tmp_path):
    env = command_env((), src=True)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs_reference.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "reference" / "workarounds.md").read_text(encoding="utf-8")
    architecture = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    recorded = _recorded()
    assert len(recorded) >= 8
    for record in recorded:
        function = record.name.rpartition(".")[2]
        assert f"`{function}`" in page, f"{record.name} is not on the generated workarounds page"
        assert f"`{function}`" in architecture, (
            f"docs/architecture.md's compat table lacks {function}"
        )
    assert page.count("\n| `compat/") == len(recorded)
