"""What every workaround records about itself, and the version check that decides whether it
applies."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import warnings
from dataclasses import dataclass

from packaging.version import Version

_warned: set[str] = set()


# (a lookup in the package metadata each time: workarounds ask per parameter and per step)
@functools.cache
def installed(library: str) -> Version | None:
    """The installed release of ``library`` (a distribution name: ``torch``, ``deepspeed``;
    ``python``: the interpreter's), or ``None``."""
    if library == "python":
        return Version(platform.python_version())
    try:
        return Version(importlib.metadata.version(library))
    except importlib.metadata.PackageNotFoundError:
        return None


def warn_once(key: str, message: str) -> None:
    """``message`` as a warning, once per process for ``key`` (a record's name)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=4)


def series(version: Version) -> str:
    """``major.minor`` of a release (``2.13.0+cpu`` -> ``2.13``): the granularity workarounds are
    checked at."""
    return f"{version.major}.{version.minor}"


@dataclass(frozen=True)
class Workaround:
    """One workaround for another library's bug or missing API."""

    name: str
    """The function applying it, as ``module.function``."""
    library: str
    """The distribution whose behaviour it works around (``torch``, ``deepspeed``,
    ``accelerate``)."""
    upstream: str
    """The upstream issue, or, where none is filed, what was searched."""
    seen_on: tuple[str, ...]
    """Release series (``major.minor``) on which the bug was seen and the workaround checked."""
    fixed_in: str | None = None
    """The first release without the bug: from there the workaround is not applied.  ``None``: not
    fixed yet."""

    def applies(self) -> bool:
        """Whether to apply it: the library is installed at a release before ``fixed_in``.  On a
        release series it was not checked on, it still applies, with one warning per process (its
        test says whether it is needed)."""
        version = installed(self.library)
        if version is None or (self.fixed_in is not None and version >= Version(self.fixed_in)):
            return False
        if series(version) not in self.seen_on and self.name not in _warned:
            _warned.add(self.name)
            warnings.warn(
                f"rankwise applies {self.name} (a workaround for {self.upstream}) to "
                f"{self.library} {version}, a release it was not checked on (checked: "
                f"{', '.join(self.seen_on)}); run tests/compat to see whether it is still needed",
                stacklevel=3,
            )
        return True


@dataclass(frozen=True)
class Patch:
    """One attribute of another library that rankwise replaces at run time: not a bug's workaround
    but code written against that library's insides all the same (often private ones), so it is
    recorded and version-checked alike."""

    target: str
    """What is replaced, as ``module.Class.attribute`` or ``module.function``, where the owner's
    ``__module__`` and ``__qualname__`` (a module's ``__name__``) place it."""
    library: str
    """The distribution it belongs to (``torch``, ``deepspeed``, ``accelerate``, ``horovod``,
    ``lightning``)."""
    why: str
    """What the replacement records or changes, and why no public API gives it."""
    seen_on: tuple[str, ...]
    """Release series (``major.minor``) on which it was checked: the attribute is there and behaves
    as relied on."""

    @property
    def private(self) -> bool:
        """Whether the owner or the attribute is private to the library (a leading underscore,
        dunders aside)."""
        return any(
            part.startswith("_") and not part.startswith("__") for part in self.target.split(".")
        )

    def check(self) -> None:
        """The version check, where the patch is made: on a release series it was not checked on it
        is still made, with one warning per process (``tests/compat/test_watch_patches.py`` says
        whether it still holds)."""
        version = installed(self.library)
        if (
            version is not None
            and series(version) not in self.seen_on
            and self.target not in _warned
        ):
            _warned.add(self.target)
            warnings.warn(
                f"rankwise replaces {self.target} "
                f"({'private, ' if self.private else ''}{self.why}) on "
                f"{self.library} {version}, a release it was not checked on (checked: "
                f"{', '.join(self.seen_on)}); run tests/compat to see whether it still holds",
                stacklevel=3,
            )


@dataclass(frozen=True)
class Private:
    """One private module, class, function or attribute of another library that rankwise reads or
    calls (not replaces): no public API gives what it needs, so the use is recorded and
    version-checked like a patch.  ``tests/compat/test_private_apis.py`` resolves every record on
    the installed releases and scans the code for a private use without one."""

    target: str
    """What is used, as ``module.Class.attribute``, ``module.function`` or ``module`` (the longest
    importable module, then attributes); an attribute only an instance has is named on its class
    with :attr:`on_instance`."""
    library: str
    """The distribution it belongs to (``torch``, ``deepspeed``, ``accelerate``, ``horovod``)."""
    why: str
    """What rankwise needs from it, and why no public API gives it."""
    seen_on: tuple[str, ...]
    """Release series (``major.minor``) on which it was checked."""
    on_instance: bool = False
    """The last part is set on instances (in ``__init__``), not on the class."""

    @property
    def name(self) -> str:
        """The private name code touches (the target's last part)."""
        return self.target.rsplit(".", 1)[-1]

    def check(self) -> None:
        """On a release series it was not checked on: one warning per process."""
        version = installed(self.library)
        if version is not None and series(version) not in self.seen_on:
            warn_once(
                self.target,
                f"rankwise uses {self.target} (private: {self.why}) on {self.library} {version}, "
                f"a release it was not checked on (checked: {', '.join(self.seen_on)}); run "
                "tests/compat to see whether it still holds",
            )
