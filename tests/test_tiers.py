"""The test tiers are explicit (tests/support/tiers.py): a marker, or a fixture that declares it
starts processes; everything else is the unit tier, where starting a process fails the test."""

import multiprocessing
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.support.tiers import (
    StartedAProcess,
    no_process_started,
    shares_a_started_fixture,
    starts_processes,
    tier_of,
)


def _item(markers=(), fixtures=()):
    """What tier_of reads from a collected test: its closest markers and its fixtures'
    definitions."""
    definitions = {
        function.__name__: [
            SimpleNamespace(func=function, scope=getattr(function, "scope", "function"))
        ]
        for function in fixtures
    }
    return SimpleNamespace(
        get_closest_marker=lambda name: name if name in markers else None,
        fixturenames=list(definitions),
        _fixtureinfo=SimpleNamespace(name2fixturedefs=definitions),
    )


def test_a_test_is_unit_unless_marked_or_using_a_fixture_that_starts_processes():
    def tmp_data():
        pass

    @starts_processes()
    def trained_run():
        pass

    @starts_processes("multinode")
    def hosts():
        pass

    assert tier_of(_item()) == "unit"
    assert tier_of(_item(fixtures=[tmp_data])) == "unit"
    assert tier_of(_item(fixtures=[tmp_data, trained_run])) == "multiproc"
    assert tier_of(_item(fixtures=[trained_run, hosts])) == "multinode"
    # the test's own marker wins
    assert tier_of(_item(markers=["slurm"], fixtures=[hosts])) == "slurm"
    assert tier_of(_item(markers=["multiproc"])) == "multiproc"


def test_a_unit_test_that_starts_a_process_fails_naming_the_marker_it_needs():
    with no_process_started("tests/x.py::test_y"):
        with pytest.raises(
            StartedAProcess,
            match=r"tests/x.py::test_y is in the unit tier but started a process "
            r"\(subprocess\): mark it @pytest.mark.multiproc",
        ):
            subprocess.run([sys.executable, "-c", "pass"])
        with pytest.raises(StartedAProcess, match=r"\(multiprocessing\)"):
            multiprocessing.get_context("spawn").Process(target=print).start()


def test_this_test_runs_in_the_unit_tier_under_the_guard(request):
    assert request.node.get_closest_marker("unit")
    with pytest.raises(StartedAProcess):
        subprocess.run(["true"])


def test_every_long_test_names_a_test_that_exists_and_says_why():
    """A renamed test would silently return to make test's time: each key must still name one."""
    from pathlib import Path

    from tests.support.long import LONG, is_long

    root = Path(__file__).parents[1]
    for nodeid, why in LONG.items():
        path, name = nodeid.split("::", 1)
        source = (root / path).read_text()
        assert f"def {name.split('[', 1)[0]}(" in source, nodeid
        assert why.startswith(("covered by: ", "only here: ")), nodeid
    assert is_long(next(iter(LONG)) + "[a-case]") and not is_long("tests/x.py::test_y")


def test_only_a_module_fixture_that_starts_processes_keeps_its_tests_on_one_worker():
    @starts_processes()
    def per_test_run():
        pass

    @starts_processes()
    def module_run():
        pass

    def module_data():
        pass

    module_run.scope = module_data.scope = "module"  # type: ignore[attr-defined]
    assert shares_a_started_fixture(_item(fixtures=[per_test_run, module_run]))
    assert not shares_a_started_fixture(_item(fixtures=[per_test_run, module_data]))
