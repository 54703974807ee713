"""Every registered strategy satisfies the contract of :class:`rankwise.strategies.base.Strategy`: a
concrete class (no abstract member left), named as registered, and every member it redefines marked
``@override`` and really overriding one of its bases' (a misspelt override would otherwise be a new,
never-called method)."""

import abc
import inspect

import pytest

from rankwise.strategies import lookup, strategy_names
from rankwise.strategies.base import Strategy
from tests.support.strategies import overrides_of_nothing, unmarked_overrides

STRATEGIES = sorted({lookup(name).cls for name in strategy_names()}, key=lambda cls: cls.name)


def test_the_contract_is_abstract_where_a_strategy_must_decide():
    assert isinstance(Strategy, abc.ABCMeta)
    assert Strategy.__abstractmethods__ == {"wrap", "unwrap", "no_sync", "library_world_size"}
    for name in Strategy.__abstractmethods__ | {
        "setup",
        "backward",
        "step",
        "save_state",
        "load_state",
    }:
        assert inspect.getdoc(getattr(Strategy, name)), (
            f"Strategy.{name} says nothing of what the loop relies on"
        )
    with pytest.raises(TypeError, match="abstract"):
        Strategy.__new__(Strategy)


@pytest.mark.parametrize("cls", STRATEGIES, ids=lambda cls: cls.name)
def test_every_registered_strategy_satisfies_the_contract(cls):
    assert issubclass(cls, Strategy) and not inspect.isabstract(cls), (
        f"{cls.__name__} leaves {sorted(cls.__abstractmethods__)} abstract"
    )
    assert lookup(cls.name).cls is cls and cls.description
    assert not unmarked_overrides(cls), (
        f"{cls.__name__} overrides {unmarked_overrides(cls)} without @override"
    )
    assert not overrides_of_nothing(cls), (
        f"{cls.__name__}: @override on {overrides_of_nothing(cls)}, which no base defines"
    )


def test_the_checks_see_a_missing_override_mark_and_an_override_of_nothing():
    from typing_extensions import override

    from rankwise.strategies.single import SingleDevice

    class Unmarked(SingleDevice):
        def unwrap(self, model):
            return model

    class Misspelt(SingleDevice):
        @override
        def unwarp(self, model):
            return model

        @property
        @override
        def library_world_size(self) -> int:
            return 1

    assert unmarked_overrides(Unmarked) == ["unwrap"] and overrides_of_nothing(Unmarked) == []
    assert overrides_of_nothing(Misspelt) == ["unwarp"] and unmarked_overrides(Misspelt) == []

    class Incomplete(Strategy):
        name = "incomplete"

    assert inspect.isabstract(Incomplete)
