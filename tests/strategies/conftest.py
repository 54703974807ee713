"""The data the strategy tests train on, prepared once per module (tests/support/strategies.py
builds it)."""

import pytest

from tests.support.strategies import prepare_case_data, prepare_toy


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """The toy and text datasets of the equivalence cases (tests.support.strategies.CASES)."""
    return prepare_case_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy dataset the resume tests train on."""
    return prepare_toy(tmp_path_factory.mktemp("toy"))
