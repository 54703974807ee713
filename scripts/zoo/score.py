"""What each command said, and how that scores against the case's manifest.

The kinds come from verify.json's ``causes[].kind`` and ``findings[].kind`` where rankwise writes
them; from an older report without them, the texts are matched against the patterns below
(``named_by="text"`` in the results says which).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

PATTERNS = {
    "comm-hook": r"exchanged through",
    "loss-scaled": r"times the one process's",
    "loss-mean": r"not a mean over the global|averaged per micro-batch",
    "learning-rate": r"another learning rate|learning rate differs",
    "scheduler": r"scheduler|schedule that does not",
    "hyperparameters": r"hyper-?parameter|betas|weight_decay differs|momentum differs",
    "samples": r"samples do not match|same dataset index gives different|data itself differs",
    "batch-dependent": r"batchnorm|batch-dependent|(?<!no layer )depends on the batch",
    "random": r"draws its own numbers|random ops? (that )?rankwise cannot",
    "own-batches": r"makes its own batches",
    "half": r"16-bit|half precision|fp16 gradients|bf16 gradients",
    "no-grad": r"without (a )?gradients?|received no gradient",
    "not-joined": r"never joined|did not join",
    "unsharded": r"no distributedsampler|not sharded|not rank-sharded",
    "epochs": r"set_epoch was never|without set_epoch",
    "counted-more": r"counted .*more than once|counted \d+ predictions .*duplicat",
    "evaluated-whole": r"evaluates the whole set on every rank|whole evaluation set on every rank",
    "replicas": r"replicas (hold different|whose weights differ|differ)|never wrapped"
    r"|not wrapped in|never averaged",
    "shared-save": r"written by every rank|every rank (wrote|writes|saved)",
    "module-prefix": r"'module\.' (keys|prefix)",
    "per-rank-metric": r"sync_dist|per-rank metric|from its own shard|one rank's (loss|metric)"
    r"|one rank's shard only|counted .*fewer",
    "sync-point": r"sync points? (on|at) every step|runs every step|every step: .*(\.item|sync)",
    "host-read": r"reads? .* back to the host|host read",
    "gradient": r"gradients? (were |was )?summed|gradient the optimizer received .*differ",
    "update": r"weights after step \d+ differ",
    "steps": r"another number of (optimizer )?steps|step count differs",
}
ERROR = re.compile(r"(Error|Exception)\b|^error:|^ERROR:|could not run", re.I)
RAISED = re.compile(r"\b\w*(Error|Exception|Interrupt|Exit): \S")  # "KeyError: 'WORLD_SIZE'"


def kinds_in(texts: list[str]) -> list[str]:
    """One kind per text (a diagnosis or a finding names one cause): the first of PATTERNS, in
    their order (the specific before the general: a comm hook's text also says the gradient
    differs, a learning rate's calls it a change of hyper-parameters), that matches."""
    found = set()
    for text in texts:
        kind = next((k for k, p in PATTERNS.items() if re.search(p, text, re.I)), None)
        found |= {kind} if kind else set()
    return sorted(found)


def _texts(entries) -> list[str]:
    return [e if isinstance(e, str) else str(e.get("text", e)) for e in entries or []]


def verify_said(out: Path) -> dict:
    """verdict, detected framework and the kinds verify.json names (empty when it wrote none)."""
    path = out / "verify.json"
    if not path.exists():
        return {}
    report = json.loads(path.read_text())
    said = {
        # (the verdict of the compared steps; score() reads the exit code's beside it)
        "verdict": report.get("verdict"),
        "framework": (report.get("framework") or {}).get("name"),
    }
    entries = list(report.get("causes") or []) + list(report.get("findings") or [])
    if "causes" in report and all(isinstance(e, dict) and e.get("kind") for e in entries):
        said.update(kinds=sorted({e["kind"] for e in entries}), named_by="kind")
    else:
        texts = _texts(report.get("diagnosis")) + _texts(entries)
        said.update(kinds=kinds_in(texts), named_by="text")
    return said


def bench_said(out: Path) -> dict:
    """The multi-process row's verdict and the kinds its reason names."""
    path = out / "report.json"
    if not path.exists():
        return {}
    rows = [r for r in json.loads(path.read_text()).get("rows", []) if r.get("processes", 1) > 1]
    if not rows:
        return {}
    row = rows[-1]
    return {
        "verdict": row.get("verdict") or row.get("status"),
        "kinds": kinds_in([str(row.get("reason") or "")]),
    }


def first_error(log: Path) -> str | None:
    """The first line of the log that reads as an error (a crash's own words)."""
    if not log.exists():
        return None
    here = str(Path(__file__).resolve().parents[2]) + "/"  # paths in the repository, relative
    text = log.read_text(errors="replace").replace(here, "")
    lines = [line.strip()[:300] for line in text.splitlines()[1:]]
    lines = [line for line in lines if not line.startswith(("File ", "raise ", "Traceback"))]
    if any("(why: under the table)" in line for line in lines):  # bench: each row's reason follows
        table = max((i for i, line in enumerate(lines) if line.startswith("|")), default=0)
        reasons = [line[2:] for line in lines[table:] if line.startswith("- ")]
        crashed = [r for r in reasons if RAISED.search(r) or re.search(r"failed|ended after", r)]
        return (crashed or reasons or [None])[0]
    # an exception's own line first, else any line reading as an error
    for pattern in (RAISED, ERROR):
        for line in lines:
            if pattern.search(line) and "Warning" not in line:
                return line
    return None


INFORMATIONAL = frozenset({"sync-point", "host-read", "start-differs", "hung-at-exit"})
"""Kinds that say how a script runs, not what it computes (a collective or a device read every step,
an initialisation that is not seeded, a rank slow to exit): named where true, never scored as a
false cause."""


def score(command: str, code: int, said: dict, expect: dict, framework: str) -> dict:
    """outcome (ok | crash | wrong | timeout); verify and bench: expected/named/missed/false."""
    result: dict = {}
    if code == 124:
        return {"outcome": "timeout"}
    if command in ("plan", "plain"):
        return {"outcome": "ok" if code == 0 else "crash"}
    verdict = said.get("verdict")
    if command == "bench" and expect.get("bench") == "could not run":
        # (a script no timed run can measure, as the manifest's bench_why says: refusing it, with
        # its reason, is right)
        refused = verdict == "could not run" and code == 4
        return {"outcome": "ok" if refused else "wrong", "verdict": verdict, "expected": []}
    if command == "verify" and code == 1 and verdict in ("equivalent", "not comparable"):
        # (the verdict verify's exit code states: a finding in the rest of the script fails an
        # equivalent or not comparable comparison, as bench's row says:
        # rankwise.tools.verify.command.outcome; "vacuous" stays what the steps showed)
        verdict = "not equivalent"
    if verdict in (None, "could not run", "failed", "error") or code not in (0, 1, 3, 5):
        result["outcome"] = "crash"
        return result
    expected, allowed = set(expect["defects"]), set(expect.get("allowed", []))
    named = set(said.get("kinds", []))
    result.update(
        expected=sorted(expected),
        named=sorted(named),
        missed=sorted(expected - named),
        false=sorted(named - expected - allowed - INFORMATIONAL),
        verdict_right=verdict == expected_verdict(command, expect),
        verdict=verdict,
    )
    # bench names one reason per row: judged on its verdict and on naming nothing false
    wrong = (
        not result["verdict_right"] or result["false"] or (command == "verify" and result["missed"])
    )
    if command == "verify" and said.get("framework") not in (None, framework):
        result["framework_right"] = False
        wrong = True
    result["outcome"] = "wrong" if wrong else "ok"
    return result


def expected_verdict(command: str, expect: dict) -> str:
    """The verdict ``command`` must say.  verify: the manifest's, of the compared steps.  bench: a
    row's verdict is verify's exit code's (one verdict everywhere), so a vacuous comparison of a
    script with a defect that changes its results is "not equivalent", as verify exits 1 for it."""
    if command == "bench" and expect["verdict"] == "vacuous" and expect["defects"]:
        return "not equivalent"
    return expect["verdict"]


SCORED = ("outcome", "expected", "named", "missed", "false", "verdict_right", "framework_right")


def judge(entry: dict, expect: dict, framework: str, verified: dict | None) -> dict:
    """``entry`` (a command's record: name, exit, what it said) scored against the manifest, in
    place; bench also against verify's exit code on the same script (one verdict everywhere)."""
    for key in (*SCORED, "disagrees"):
        entry.pop(key, None)
    said = {k: entry[k] for k in ("verdict", "framework", "kinds") if k in entry}
    entry.update(score(entry["name"], entry["exit"], said, expect, framework))
    refused = expect.get("bench") == "could not run"  # (as expected: no verdict to agree on)
    if entry["name"] == "bench" and verified and entry["outcome"] == "ok" and not refused:
        if entry["exit"] != verified["exit"]:
            entry.update(
                outcome="wrong", disagrees=f"exit {entry['exit']}, verify's {verified['exit']}"
            )
    return entry
