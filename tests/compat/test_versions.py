"""The version check every workaround goes through: applied before the fixing release, warned once
elsewhere."""

import warnings

import pytest
from packaging.version import Version

from rankwise.compat import versions
from rankwise.compat.versions import Workaround

BUG = Workaround(
    name="tests.bug",
    library="torch",
    upstream="https://example.invalid/1",
    seen_on=("2.13",),
    fixed_in="2.14",
)


@pytest.fixture
def torch_release(monkeypatch):
    def pretend(release: str | None):
        monkeypatch.setattr(
            versions, "installed", lambda library: None if release is None else Version(release)
        )
        monkeypatch.setattr(versions, "_warned", set())

    return pretend


def test_a_workaround_applies_on_the_releases_it_was_seen_on_without_a_word(torch_release):
    torch_release("2.13.0+cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert BUG.applies()


def test_the_fixing_release_and_a_missing_library_skip_it(torch_release):
    torch_release("2.14.0")
    assert not BUG.applies()
    torch_release(None)
    assert not BUG.applies()


def test_a_release_it_was_not_checked_on_applies_it_and_warns_once(torch_release):
    torch_release("2.11.0")
    with pytest.warns(
        UserWarning, match=r"tests.bug .* to torch 2.11.0, a release it was not checked on"
    ):
        assert BUG.applies()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert BUG.applies()  # once per process


def test_every_workaround_names_its_upstream_and_the_installed_release_it_was_checked_on():
    from rankwise.compat import accelerate_state, deepspeed_zero, torch_compile, torch_elastic

    found = [
        value
        for module in (accelerate_state, deepspeed_zero, torch_compile, torch_elastic)
        for value in vars(module).values()
        if isinstance(value, Workaround)
    ]
    assert len(found) == 8
    for workaround in found:
        assert workaround.upstream and workaround.seen_on
        module, _, function = workaround.name.rpartition(".")
        assert callable(getattr(__import__(module, fromlist=[function]), function)), workaround.name
    unchecked = [
        f"{w.name} on {w.library} {versions.installed(w.library)}"
        for w in found
        if versions.installed(w.library) is not None
        and versions.series(versions.installed(w.library)) not in w.seen_on
    ]
    # (a release pyproject allows, not yet checked: the workaround applies and warns once)
    if unchecked:
        pytest.skip(
            "not yet checked on the installed releases: run tests/compat here and add the series "
            "to seen_on: " + "; ".join(unchecked)
        )
