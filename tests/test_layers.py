"""The layer rule, checked on the source: the library imports neither the training app nor the tools
(and inside the library, each group imports only the groups below it), the app never imports the
tools, nothing but the entry point imports the command line, and no module imports another that
(directly or not) imports it back.  Imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[1] / "src"
APP = ("rankwise.train", "rankwise.data", "rankwise.models")
TOOLS = ("rankwise.tools",)
CLI = ("rankwise.cli",)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SOURCE / "rankwise").rglob("*.py")):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The rankwise modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod`` when it
    is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {module for module in found if module in MODULES and module != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(module: str) -> str:
    def within(prefixes):
        return any(module == p or module.startswith(p + ".") for p in prefixes)

    return (
        "cli" if within(CLI) else "tools" if within(TOOLS) else "app" if within(APP) else "library"
    )


ALLOWED = {
    "library": {"library"},
    "app": {"library", "app"},
    "tools": {"library", "app", "tools"},
    "cli": {"library", "app", "tools", "cli"},
}


def test_the_layers_are_the_ones_the_design_names():
    assert (
        layer("rankwise.runtime")
        == layer("rankwise.strategies.ddp")
        == layer("rankwise.launch.torchrun")
        == layer("rankwise.checkpoint")
        == "library"
    )
    assert layer("rankwise.train.loop") == layer("rankwise.data.prepare") == "app"
    assert layer("rankwise.tools.bench.suite") == "tools" and layer("rankwise.cli.train") == "cli"
    assert "rankwise.train.loop" in GRAPH["rankwise.train.worker"]  # the graph sees imports at all


def test_compat_is_library_code_that_depends_on_no_other_rankwise_module():
    """Workarounds for other libraries sit in the library layer, at its bottom: every layer may use
    them, and removing one touches its module and its call sites only."""
    compat = [
        name for name in MODULES if name == "rankwise.compat" or name.startswith("rankwise.compat.")
    ]
    assert len(compat) > 1 and all(layer(name) == "library" for name in compat)
    for name in compat:
        assert all(imported.startswith("rankwise.compat") for imported in GRAPH[name]), (
            name,
            GRAPH[name],
        )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_one_way(module):
    wrong = sorted(
        imported for imported in GRAPH[module] if layer(imported) not in ALLOWED[layer(module)]
    )
    assert not wrong, f"{module} ({layer(module)}) imports {', '.join(wrong)}"


SUBLAYERS = (
    # The library's own layers, bottom first: a module imports its own group and the groups listed
    # before it (below it).
    (
        "base",
        (
            "rankwise.errors",
            "rankwise.envvars",
            "rankwise.logs",
            "rankwise.compat",
            "rankwise.dist",
            "rankwise.process",
            "rankwise.precision",
        ),
    ),
    ("sampling", ("rankwise.sampling",)),
    ("measure", ("rankwise.measure",)),
    ("checkpoint formats", ("rankwise.checkpoint",)),
    ("strategies", ("rankwise.strategies",)),
    ("launch", ("rankwise.launch",)),
    ("resume", ("rankwise.checkpoint.resume",)),
    ("runtime", ("rankwise.runtime", "rankwise.testing")),
    ("public API", ("rankwise",)),
)
SIBLINGS = {"sampling": "measure", "measure": "sampling"}
"""Groups on one level: neither imports the other."""


def sublayer(module: str) -> int:
    """The index in :data:`SUBLAYERS` of the library group ``module`` belongs to (the longest prefix
    decides)."""
    matches = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(SUBLAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is in no group of SUBLAYERS: add it there"
    return max(matches)[1]


def test_every_library_module_has_a_group_and_the_groups_are_the_design():
    library = [name for name in MODULES if layer(name) == "library"]
    assert len(library) > 60
    names = {name: SUBLAYERS[sublayer(name)][0] for name in library}
    assert (
        names["rankwise.checkpoint.resume"] == "resume"
        and names["rankwise.checkpoint.protocol"] == "checkpoint formats"
    )
    assert names["rankwise.runtime.hangs"] == "runtime" and names["rankwise"] == "public API"
    assert names["rankwise.compat.versions"] == names["rankwise.dist"] == "base"


@pytest.mark.parametrize("module", sorted(name for name in MODULES if layer(name) == "library"))
def test_library_groups_import_downwards(module):
    """Within the library: the runtime uses the strategies, which use the checkpoint formats,
    sampling and measuring, which use the base; never the other way."""
    own = sublayer(module)
    wrong = [
        imported
        for imported in GRAPH[module]
        if layer(imported) == "library"
        and (
            sublayer(imported) > own
            or SUBLAYERS[sublayer(imported)][0] == SIBLINGS.get(SUBLAYERS[own][0])
        )
    ]
    assert not wrong, (
        f"{module} ({SUBLAYERS[own][0]}) imports {', '.join(sorted(wrong))} from a group above "
        "it (listed after its own)"
    )


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle a depth-first walk of ``graph`` meets (module -> the modules it
    imports)."""

    def parents(module: str) -> set[str]:  # importing a.b.c runs a/__init__ and a/b/__init__ first
        parts = module.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))} & graph.keys()

    edges = {
        m: {t for i in imports for t in {i} | parents(i) if t != m and not m.startswith(t + ".")}
        for m, imports in graph.items()
    }
    done, active, cycles = set(), [], []

    def visit(module: str) -> None:
        if module in active:
            cycles.append(active[active.index(module) :] + [module])
            return
        if module in done:
            return
        active.append(module)
        for target in sorted(edges[module]):
            visit(target)
        active.pop()
        done.add(module)

    for module in sorted(edges):
        visit(module)
    return cycles


def test_the_cycle_check_finds_cycles():
    assert find_cycles({"p.a": {"p.b"}, "p.b": {"p.a"}}) == [["p.a", "p.b", "p.a"]]
    # q -> p.b runs p, not p.a
    assert find_cycles({"p": set(), "p.a": {"q"}, "q": {"p.b"}, "p.b": set()}) == []
    # importing p.a runs p
    assert find_cycles({"p": {"q"}, "p.a": set(), "q": {"p.a"}}) == [["p", "q", "p"]]


def test_no_import_cycles():
    cycles = find_cycles(GRAPH)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


MODULE_LINES = 500
"""A guide to when a module does more than one job, not a reason to pack lines: ruff format lays the
code out at 100 columns, and the same code that fit 420 lines packed at 120 takes about 550 (src/
grew from 22,800 to 29,900 lines when it was formatted); 500 asks for a split a little earlier."""


def test_no_source_module_is_long():
    lines = {
        name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()
    }
    long = {name: n for name, n in lines.items() if n > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines (split them by job): {long}"


NAMESPACE_ALLOWED = {
    "rankwise.checkpoint.deepspeed_format": "DeepSpeed's universal conversion takes its own "
    "argparse namespace",
    "rankwise.launch.torchrun": "torchrun's own parser and namespace, which rankwise launch "
    "extends",
    "rankwise.tools.bench.sharded_memory": "a `python -m` benchmark with its own main()",
    "rankwise.tools.bench.sentiment_baseline": "a `python -m` benchmark with its own main()",
    "rankwise.tools.comm.sizes": "its size parser is an argparse type (ArgumentTypeError is "
    "argparse's message)",
}
"""Modules outside ``cli/`` that may use argparse, each with the reason."""


def test_flags_become_typed_settings_at_the_edge():
    """Only ``cli/`` parses flags: outside it argparse is imported only where another library's API
    needs it, and no function reads flags off a parameter called ``args`` (the way a namespace was
    handed down)."""

    def imports_argparse(path: Path) -> bool:
        return any(
            (isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names))
            or (isinstance(node, ast.ImportFrom) and node.module == "argparse")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )

    users = {
        name
        for name, path in MODULES.items()
        if layer(name) != "cli" and name != "rankwise.__main__" and imports_argparse(path)
    }
    assert users == set(NAMESPACE_ALLOWED), sorted(users ^ set(NAMESPACE_ALLOWED))
    # A namespace passed along needs no import: no function outside cli/ reads flags off a parameter
    # called args.
    readers = sorted(
        f"{name}.{node.name}"
        for name, path in MODULES.items()
        if layer(name) != "cli" and name not in NAMESPACE_ALLOWED
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and "args"
        in [arg.arg for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        and any(
            isinstance(inner, ast.Attribute)
            and isinstance(inner.value, ast.Name)
            and inner.value.id == "args"
            for inner in ast.walk(node)
        )
    )
    assert not readers, readers


ROLE_NAMES = {"records", "report", "settings", "config", "command"}
"""Module names that repeat on purpose: the same role in each package that has it (its typed
records, its report, its settings, its config, its command's run), so a reader knows where to
look."""


def test_module_names_say_their_job():
    """Two modules of the same name are two places a reader (and a traceback) confuses: beyond the
    role names, and ``cli/``'s modules named after the command they parse, a module's name is its
    own."""
    by_name: dict[str, list[str]] = {}
    for name in MODULES:
        leaf = name.rpartition(".")[2]
        if (
            name.startswith("rankwise.cli.")
            or leaf in ROLE_NAMES
            or MODULES[name].stem == "__init__"
        ):
            continue
        by_name.setdefault(leaf, []).append(name)
    repeated = {leaf: names for leaf, names in by_name.items() if len(names) > 1}
    assert not repeated, f"module names that collide (name each by its job): {repeated}"
