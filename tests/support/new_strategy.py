"""A strategy file the tests have never seen, loaded as a pytest plugin (``pytest -p
tests.support.new_strategy``): it stands for a new ``src/rankwise/strategies/throwaway.py`` -- one
``@register`` class and nothing else edited. tests/strategies/test_registry.py collects the strategy
tests with it and checks which of them it gets.

``--collected-to PATH`` writes every collected test's id to PATH (before ``-k`` deselects any)."""

from pathlib import Path

import pytest

from rankwise.strategies import register
from rankwise.strategies.ddp import DDP


@register
class Throwaway(DDP):
    name = "throwaway"
    description = "DDP under a name no test spells: what a new strategy file gets from the tests"


def pytest_addoption(parser):
    parser.addoption(
        "--collected-to", default=None, help="write every collected test id to this file"
    )


@pytest.hookimpl(tryfirst=True)  # before -k deselects any
def pytest_collection_modifyitems(config, items):
    path = config.getoption("collected_to")
    if path:
        Path(path).write_text("".join(f"{item.nodeid}\n" for item in items), encoding="utf-8")
