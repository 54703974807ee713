"""make zoo: every case of zoo/ through rankwise verify, bench --script and plan, and the plain run.

python scripts/zoo                       # every case: runs/zoo/results.json, docs/reference/zoo.md
python scripts/zoo --only nanogpt --commands verify
python scripts/zoo --check               # the manifests and patches only, nothing run
python scripts/zoo --make-patch CASE DIR # write zoo/CASE/cpu.patch from an edited copy in DIR
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import cases  # noqa: E402
import patches  # noqa: E402
import runs  # noqa: E402
import score  # noqa: E402
import table  # noqa: E402

PRINT = threading.Lock()


def say(line: str) -> None:
    with PRINT:
        print(line, flush=True)


def run_case(case: cases.Case, names: list[str], rankwise: str, out: Path) -> dict:
    base = out / case.name
    base.mkdir(parents=True, exist_ok=True)
    result = {
        "name": case.name,
        "url": case.url,
        "framework": case.run["framework"],
        "expect": case.expect,
        "commands": [],
    }
    try:
        env = runs.environment(runs.site_for(case, Path(sys.prefix) / "zoo-sites"))
    except subprocess.CalledProcessError as error:
        line = (error.stderr or "").strip().splitlines()[-1:] or ["pip failed"]
        say(f"zoo {case.name}: its requirements could not be installed: {line[0]}")
        result["error"] = f"requirements: {line[0]}"
        return result
    for command in runs.commands(case, rankwise, base):
        if command.name not in names:
            continue
        cwd = runs.workdir(case, base / f"work-{command.name}")
        log = base / f"{command.name}.log"
        say(f"zoo {case.name}: {command.name} ...")
        code, wall = runs.run(command, cwd, env, log)
        said = {}
        if command.name == "verify":
            said = score.verify_said(command.out)
        elif command.name == "bench":
            said = score.bench_said(command.out)
        entry = {
            "name": command.name,
            "exit": code,
            "wall_s": round(wall, 1),
            "log": str(log),
            **said,
        }
        verified = next((c for c in result["commands"] if c["name"] == "verify"), None)
        score.judge(entry, case.expect, case.run["framework"], verified)
        if entry["outcome"] in ("crash", "timeout"):
            entry["error"] = score.first_error(log)
        result["commands"].append(entry)
        extra = f" {said['verdict']}" if said.get("verdict") else ""
        missed = f" missed {entry['missed']}" if entry.get("missed") else ""
        false = f" false {entry['false']}" if entry.get("false") else ""
        note = f" ({entry['disagrees']})" if entry.get("disagrees") else ""
        say(
            f"zoo {case.name}: {command.name} {entry['outcome']} exit {code} {wall:.0f} s"
            f"{extra}{missed}{false}{note}"
        )
    return result


def save(args: argparse.Namespace, done: list[dict], started: float) -> Path:
    """Merge ``done`` into results.json (a case's commands not run now keep their last result) and
    write the page."""
    path = args.out / "results.json"
    kept = json.loads(path.read_text()) if path.exists() else {"cases": [], "meta": {}}
    merged = {c["name"]: c for c in kept["cases"]}
    for case in done:
        old = {c["name"]: c for c in merged.get(case["name"], {}).get("commands", [])}
        old.update({c["name"]: c for c in case["commands"]})
        merged[case["name"]] = dict(case, commands=[old[n] for n in runs.COMMANDS if n in old])
    results = {
        "meta": {
            "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git("rev-parse", "--short", "HEAD"),
            "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "torch": _torch_version(),
            "machine": f"{os.cpu_count()} CPU cores ({platform.machine()}), no GPU",
            "jobs": args.jobs,
            "total_s": round(time.monotonic() - started, 1),
            "note": args.note,
        },
        "cases": [merged[name] for name in sorted(merged)],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    if not args.no_page:
        args.page.write_text(table.page(results))
    return path


def git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=cases.ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/zoo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", "--only", default="", help="case names, comma-separated (default: all)"
    )
    parser.add_argument(
        "--commands", default=",".join(runs.COMMANDS), help="verify,bench,plan,plain"
    )
    parser.add_argument("--out", type=Path, default=cases.ROOT / "runs" / "zoo")
    parser.add_argument("--page", type=Path, default=cases.ROOT / "docs" / "reference" / "zoo.md")
    parser.add_argument("--no-page", action="store_true", help="do not write the docs page")
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    parser.add_argument(
        "--rankwise", default=runs.tool("rankwise"), help="the CLI (default: the venv's)"
    )
    parser.add_argument("--check", action="store_true", help="check the manifests and patches only")
    parser.add_argument("--make-patch", nargs=2, metavar=("CASE", "EDITED_DIR"))
    parser.add_argument("--licenses", action="store_true", help="write zoo/LICENSES.md")
    parser.add_argument("--note", default="", help="a line for the page's header (how it was run)")
    parser.add_argument(
        "--rewrite-page", action="store_true", help="write the page from results.json, run nothing"
    )
    args = parser.parse_args(argv)

    if args.make_patch:
        case = cases.load(cases.ZOO / args.make_patch[0])
        edited = {
            name: (Path(args.make_patch[1]) / name).read_text() for name in case.source["files"]
        }
        (case.dir / "cpu.patch").write_text(patches.make(case.originals(), edited))
        problems = cases.problems(case.dir)
        print("\n".join(problems) or f"wrote zoo/{case.name}/cpu.patch")
        return 1 if problems else 0

    if args.rewrite_page:  # re-judged against the manifests as they are now
        results = json.loads((args.out / "results.json").read_text())
        results["meta"]["note"] = args.note or results["meta"].get("note", "")
        for done in results["cases"]:
            if (cases.ZOO / done["name"] / "case.toml").exists():
                case = cases.load(cases.ZOO / done["name"])
                done.update(expect=case.expect, framework=case.run["framework"], url=case.url)
                verified = next((c for c in done["commands"] if c["name"] == "verify"), None)
                for entry in done["commands"]:
                    said = {"verify": score.verify_said, "bench": score.bench_said}.get(
                        entry["name"]
                    )
                    entry.update(said(args.out / done["name"] / entry["name"]) if said else {})
                    score.judge(entry, case.expect, case.run["framework"], verified)
                    entry.pop("error", None)
                    if entry["outcome"] in ("crash", "timeout"):
                        entry["error"] = score.first_error(Path(entry["log"]))
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        args.page.write_text(table.page(results))
        return 0

    if args.licenses:
        (cases.ZOO / "LICENSES.md").write_text(cases.licenses(cases.all_cases()))
        return 0

    wanted = [c for c in args.cases.split(",") if c]
    dirs = [d for d in cases.all_cases() if not wanted or d.name in wanted]
    unknown = set(wanted) - {d.name for d in dirs}
    if unknown:
        print(
            f"scripts/zoo: no case named {', '.join(sorted(unknown))} under zoo/", file=sys.stderr
        )
        return 2
    bad = {d.name: cases.problems(d) for d in dirs}
    for problems in bad.values():
        for line in problems:
            print(line, file=sys.stderr)
    if args.check:
        print(f"{len(dirs)} cases, {sum(1 for p in bad.values() if p)} with problems")
        return 1 if any(bad.values()) else 0
    sound = [cases.load(d) for d in dirs if not bad[d.name]]
    names = [n for n in args.commands.split(",") if n]

    started = time.monotonic()
    done: list[dict] = []

    def one(case: cases.Case) -> None:
        result = run_case(case, names, args.rankwise, args.out)
        with (
            PRINT
        ):  # results.json and the page after every case: an interrupted zoo keeps its cases
            done.append(result)
            save(args, [result], started)

    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        list(pool.map(one, sound))
    broken = [
        {"name": name, "url": "", "framework": "?", "commands": [], "error": "; ".join(problems),
         "expect": {"verdict": "?", "defects": [], "why": ""}}
        for name, problems in bad.items() if problems
    ]  # fmt: skip
    done += broken
    path = save(args, broken, started)
    tally = [c["outcome"] for case in done for c in case["commands"]]
    print(
        f"zoo: {len(done)} cases, "
        + ", ".join(f"{tally.count(o)} {o}" for o in ("ok", "wrong", "crash", "timeout"))
    )
    print(f"wrote {path}" + ("" if args.no_page else f" and {args.page}"))
    return 1 if any(bad.values()) else 0


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
