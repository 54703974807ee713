"""Whether a training script clips its gradients' norm, read from its source.

The plan captures a script at its first training forward, before any clipping could be seen, so
the script's text answers instead: a call of ``clip_grad_norm_`` (torch, Accelerate) or
``clip_grad_norm`` (``rt.clip_grad_norm``), or a call or setting given a norm to clip to
(``rt.step(..., max_norm=1.0)``; Fabric's ``clip_gradients(..., max_norm=)``, not its ``clip_val``,
which clips each value; Lightning's ``gradient_clip_val``; Transformers' ``max_grad_norm``;
DeepSpeed's ``gradient_clipping``), with a value that is not ``None`` or 0.
A sharded strategy then all-reduces the norm (:attr:`rankwise.strategies.facts.StepCall
.when_clipping`).  Clipping chosen only at run time (a flag's default, a config file) is not seen:
the reading says which line it found, or that it found none.
"""

from __future__ import annotations

import ast
from pathlib import Path

CALLS = ("clip_grad_norm_", "clip_grad_norm")
KEYWORDS = ("max_norm", "gradient_clip_val", "max_grad_norm", "gradient_clipping")


def clipping_line(script: Path) -> int | None:
    """The first line of ``script`` that clips the gradients' norm, or ``None``."""
    try:
        tree = ast.parse(Path(script).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None  # the capture reports a script it cannot read or run
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _clips(node):
            return node.lineno
        if isinstance(node, ast.Dict) and _clips_in_dict(node):
            return node.lineno
    return None


def _clips(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name in CALLS:
        return True
    if name == "clip_gradients" and len(call.args) >= 4:  # Fabric's (module, optimizer, clip_val,
        return _set(call.args[3])  # max_norm): clip_val clips each value, with no norm to reduce
    return any(kw.arg in KEYWORDS and _set(kw.value) for kw in call.keywords)


def _clips_in_dict(node: ast.Dict) -> bool:
    """A config written in the script (DeepSpeed's ``{"gradient_clipping": 1.0}``)."""
    return any(
        isinstance(key, ast.Constant) and key.value in KEYWORDS and _set(value)
        for key, value in zip(node.keys, node.values, strict=True)
    )


def _set(value: ast.expr) -> bool:
    """Not a literal ``None``, 0 or ``False`` (a name or an expression may hold a norm)."""
    return not (isinstance(value, ast.Constant) and value.value in (None, 0, False))
