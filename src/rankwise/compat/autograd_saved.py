"""torch: what an autograd node saved from its forward (``grad_fn._saved_<name>``).

Each node of a loss's graph exposes the arguments and sizes its backward needs as ``_saved_*``
attributes (torch's "Autograd mechanics" notes document them: ``y.grad_fn._saved_self``); the
names come from ``derivatives.yaml`` and may change between releases.  rankwise reads three, to see
how a loss reduced its batch (``rankwise.tools.watch.reduction``): ``SumBackward0``'s
``self_sym_sizes``, a loss function's ``reduction`` and ``self``, and a scaling's ``other``.
``tests/compat/test_autograd_saved.py`` checks them on the installed torch.
"""

from __future__ import annotations

SEEN_ON = ("2.11", "2.13")
"""torch release series it was used on (the CPU machines' 2.13, the GPU pass's 2.11)."""

_MISSING = object()


def saved(node: object, name: str, default: object = None) -> object:
    """What ``node`` saved as ``name`` (``default`` where it saved nothing of the name, or freed
    it after its backward ran)."""
    try:
        value = getattr(node, f"_saved_{name}", _MISSING)
    except RuntimeError:  # (freed: the backward already ran without retain_graph)
        return default
    return default if value is _MISSING else value
