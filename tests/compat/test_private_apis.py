"""Every private API of torch, DeepSpeed, Accelerate, Lightning, Horovod and Transformers that
rankwise touches has a record in ``rankwise.compat`` (a :class:`Private`, a :class:`Patch` or a
:class:`Workaround`), resolves on the installed releases, and a private module of theirs is imported
only under ``compat/``."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

import rankwise.compat
from rankwise.compat import plan_patches
from rankwise.compat.versions import Patch, Private, Workaround
from tests.support.records import installed, resolve

SRC = Path(rankwise.compat.__file__).parents[1]
LIBRARIES = (
    "torch",
    "deepspeed",
    "accelerate",
    "lightning",
    "lightning_fabric",
    "pytorch_lightning",
    "horovod",
    "transformers",
)
PROTOCOL = frozenset({"_fields", "_asdict", "_replace", "_make"})
"""Private-looking names that are a documented protocol (namedtuple's), not a library's insides."""


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def records() -> list[Private | Patch]:
    """Every record in ``rankwise.compat``'s modules (module-level, or in a tuple or dict there)."""
    found: list[Private | Patch] = []
    for info in pkgutil.iter_modules(rankwise.compat.__path__):
        module = importlib.import_module(f"rankwise.compat.{info.name}")
        for value in vars(module).values():
            values = value.values() if isinstance(value, dict) else value
            items = values if isinstance(values, (tuple, list, type({}.values()))) else [value]
            found += [item for item in items if isinstance(item, (Private, Patch))]
    return found


def _recorded_names() -> set[str]:
    """The private names the records cover: each target's private parts, and what a workaround's
    own module touches."""
    names = {part for record in records() for part in record.target.split(".") if _private(part)}
    for info in pkgutil.iter_modules(rankwise.compat.__path__):
        module = importlib.import_module(f"rankwise.compat.{info.name}")
        # a workaround's record covers the private attributes its function touches
        if any(isinstance(value, Workaround) for value in vars(module).values()):
            names |= _touched_in(Path(module.__file__))
    return names


def _touched_in(path: Path) -> set[str]:
    return {name for _, _, name in _uses(path, own=frozenset())}


def _own_names(trees: list[ast.Module]) -> frozenset[str]:
    """Names rankwise defines itself: its functions, classes, class attributes and the attributes
    it sets on ``self`` (its own markers on other objects start with ``_rankwise``)."""
    own: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    targets = (
                        statement.targets
                        if isinstance(statement, ast.Assign)
                        else [statement.target]
                        if isinstance(statement, ast.AnnAssign)
                        else []
                    )
                    own |= {t.id for t in targets if isinstance(t, ast.Name)}
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                own.add(node.attr)
    return frozenset(own)


def _uses(path: Path, own: frozenset[str]) -> list[tuple[int, str, str]]:
    """(line, what, private name) for each private module imported and each private attribute of
    the libraries touched in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases: dict[str, str] = {}
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                aliases[alias.asname or top] = alias.name if alias.asname else top
                if top in LIBRARIES and any(map(_private, alias.name.split("."))):
                    found.append((node.lineno, f"import {alias.name}", "module"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                aliases[alias.asname or alias.name] = dotted
                if node.module.split(".")[0] in LIBRARIES:
                    parts = [p for p in dotted.split(".") if _private(p)]
                    if any(map(_private, node.module.split("."))):
                        found.append((node.lineno, f"from {node.module} import", "module"))
                    elif parts:
                        found.append((node.lineno, dotted, parts[-1]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base, chain = node.value, []
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            name = base.id if isinstance(base, ast.Name) else None
            if name in aliases:
                dotted = ".".join([aliases[name], *reversed(chain), node.attr])
                if dotted.split(".")[0] in LIBRARIES and not node.attr.startswith("_rankwise"):
                    found.append((node.lineno, dotted, node.attr))
            elif (
                name not in ("self", "cls", *aliases)
                and node.attr not in own
                and node.attr not in PROTOCOL
                and not node.attr.startswith("_rankwise")
            ):
                found.append((node.lineno, f"?.{node.attr}", node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            attr = node.args[1].value
            if (
                _private(attr)
                and attr not in own
                and attr not in PROTOCOL
                and not attr.startswith("_rankwise")
            ):
                found.append((node.lineno, f"{node.func.id}(..., {attr!r})", attr))
    return sorted(found)


@pytest.fixture(scope="module")
def scanned() -> dict[Path, list[tuple[int, str, str]]]:
    files = sorted(SRC.rglob("*.py"))
    recorded = _recorded_names()
    trees = [ast.parse(path.read_text(encoding="utf-8")) for path in files]
    # a name a record names is the library's even where rankwise also defines it (a stand-in)
    own = _own_names(trees) - recorded
    return {path: _uses(path, own) for path in files}


def test_a_private_module_of_a_library_is_imported_only_under_compat(scanned):
    outside = [
        f"{path.relative_to(SRC)}:{line} {what}"
        for path, uses in scanned.items()
        if "compat" not in path.relative_to(SRC).parts
        for line, what, name in uses
        if name == "module"
    ]
    assert not outside, "import it from a rankwise.compat module, with a record:\n" + "\n".join(
        outside
    )


def test_every_private_attribute_touched_has_a_record(scanned):
    recorded = _recorded_names()
    missing = [
        f"{path.relative_to(SRC)}:{line} {what}"
        for path, uses in scanned.items()
        for line, what, name in uses
        if name != "module" and name not in recorded
    ]
    assert not missing, "no record in rankwise.compat (a Private in compat/private.py):\n" + (
        "\n".join(missing)
    )


def test_the_scan_finds_what_it_is_for(tmp_path):
    """The scan itself, on code it must refuse: a private module imported, a private attribute of a
    library module and of an object, and one read by name."""
    code = tmp_path / "bad.py"
    code.write_text(
        "import torch.distributed as dist\n"
        "from torch._subclasses import fake_tensor\n"
        "store = dist.distributed_c10d._get_default_store()\n"
        "state = optimizer._secret_state\n"
        "flag = getattr(engine, '_hidden_flag', None)\n"
        "row = point._asdict()\n",
        encoding="utf-8",
    )
    names = [name for _, _, name in _uses(code, own=frozenset())]
    assert names == ["module", "_get_default_store", "_secret_state", "_hidden_flag"]


@pytest.mark.parametrize(
    "record",
    [record for record in records() if isinstance(record, Private)],
    ids=lambda record: record.target,
)
def test_each_private_record_is_there_on_the_installed_release(record):
    if not installed(record.library):
        pytest.skip(f"{record.library} is not installed")
    if record.on_instance:
        owner = resolve(record.target.rsplit(".", 1)[0])
        module = owner if isinstance(owner, ModuleType) else sys.modules[owner.__module__]
        source = Path(str(module.__file__)).read_text(encoding="utf-8")
        assert record.name in source, f"{record.target}: no longer in {module.__name__}"
    else:
        resolve(record.target)


@pytest.mark.parametrize(
    "record", list(plan_patches.PATCHES.values()), ids=lambda record: record.target
)
def test_what_the_plan_replaces_is_there_on_the_installed_torch(record):
    resolve(record.target)
