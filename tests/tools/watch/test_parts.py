"""The watcher's parts are changed through their own methods: no module of ``tools/watch`` assigns
another part's fields, directly (``watcher.step_watch.in_runtime_step = True``) or through a local
name (``step_watch = self.step_watch; step_watch.step += 1``)."""

from __future__ import annotations

import ast
from pathlib import Path

import rankwise.tools.watch

WATCH = Path(rankwise.tools.watch.__file__).parent
PARTS = {
    "step_watch": "step_watch.py",
    "data": "loaders.py",
    "calls": "calls.py",
    "window": "window.py",
    "saves": "saves.py",
    "models": "models.py",
    "lockstep": "lockstep.py",
    "gathered": "gathered.py",
    "metrics": "shard_metrics.py",
}
"""Each part's attribute name on the watcher (or on calls), and the module that owns its class."""


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def assignments_into_parts(path: Path) -> list[str]:
    """Each assignment in ``path`` to a field of a part it does not own."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            continue
        aliases: dict[str, str] = {}  # a local name -> the part it holds
        for node in ast.walk(function):
            if isinstance(node, ast.Assign):
                pairs = []
                for target in node.targets:
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        pairs += zip(target.elts, node.value.elts)
                    else:
                        pairs.append((target, node.value))
                for target, value in pairs:
                    if (
                        isinstance(target, ast.Name)
                        and isinstance(value, ast.Attribute)
                        and value.attr in PARTS
                    ):
                        aliases[target.id] = value.attr
            for target in _targets(node):
                if not isinstance(target, ast.Attribute):
                    continue
                owner = target.value
                part = (
                    owner.attr
                    if isinstance(owner, ast.Attribute) and owner.attr in PARTS
                    else aliases.get(owner.id)
                    if isinstance(owner, ast.Name)
                    else None
                )
                if part is not None and PARTS[part] != path.name:
                    found.append(f"{path.name}:{node.lineno} {ast.unparse(target)}")
    return sorted(set(found))


def test_each_part_names_its_module():
    """(A part's module renamed leaves no stale name here: every assignment would pass.)"""
    assert not [module for module in PARTS.values() if not (WATCH / module).exists()]


def test_no_module_assigns_another_parts_fields():
    found = [line for path in sorted(WATCH.glob("*.py")) for line in assignments_into_parts(path)]
    assert not found, "give the part a method for it:\n" + "\n".join(found)


def test_the_check_finds_both_forms(tmp_path):
    code = tmp_path / "adapter.py"
    code.write_text(
        "def step(watcher):\n"
        "    watcher.step_watch.in_runtime_step = True\n"
        "    step_watch = watcher.step_watch\n"
        "    step_watch.step += 1\n"
        "    watcher.step_watch.runtime_step_begins()\n",
        encoding="utf-8",
    )
    assert assignments_into_parts(code) == [
        "adapter.py:2 watcher.step_watch.in_runtime_step",
        "adapter.py:4 step_watch.step",
    ]
