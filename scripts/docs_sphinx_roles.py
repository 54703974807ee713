"""A griffe extension for the docs site's API reference: rankwise's docstrings name other objects
with Sphinx roles (:class:`Runtime`, :meth:`step`), which Markdown would show as written; each
becomes the name as code."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):`~?([^`]+)`")


class SphinxRoles(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"`\1`", obj.docstring.value)
