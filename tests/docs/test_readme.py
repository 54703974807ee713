"""The README's and the quick start's commands: every `rankwise` line parses, and the cheap ones run
(small)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rankwise.cli import build_parser
from rankwise.cli.launch import command_line_parser
from rankwise.measure.tolerance import max_param_diff
from tests.support.cli import ROOT, command, command_env, json_summary, rankwise
from tests.support.docs.commands import code_blocks, commands, rankwise_commands

README = ROOT / "README.md"
FIRST_RUN = ROOT / "docs" / "getting-started" / "first-run.md"
PORTING = ROOT / "docs" / "getting-started" / "porting.md"
PAGES = [README, *sorted(page for page in (ROOT / "docs").rglob("*.md") if rankwise_commands(page))]
"""The README and every docs page that shows a `rankwise` command."""


def _env() -> dict[str, str]:
    return command_env(src=True)


def test_the_pages_with_commands_include_the_quick_start():
    assert FIRST_RUN in PAGES and len(PAGES) > 5


def test_the_readme_shows_make_demo_and_make_test_first():
    assert commands(README)[:2] == [["make", "demo"], ["make", "test"]]


def test_the_readme_points_to_the_architecture_page_before_its_first_section():
    """A contributor finds the map of the code at the top, not at line 177 of 182."""
    top = README.read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert "(docs/architecture.md)" in top and "(docs/contributing.md)" in top


def test_contributing_says_which_configuration_idiom_serves_which_job():
    """User config (pydantic), a tool's settings (frozen dataclasses), a value that crosses a
    process (a registered RANKWISE_* variable): one paragraph each."""
    text = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    section = text.split("- Configuration, three idioms, one job each:", 1)[1].split("\n- ", 1)[0]
    section = " ".join(section.split())
    for idiom in ("pydantic", "frozen dataclasses", "`RANKWISE_*` environment variable"):
        assert idiom in section, idiom


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_rankwise_command_on_the_page_parses(page):
    shown = rankwise_commands(page)
    for argv in shown:
        try:
            # torchrun's parser with rankwise's flags (see rankwise.cli.main)
            if argv[0] == "launch":
                command_line_parser().parse_known_args(argv[1:])
            else:
                build_parser().parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"{page.name}: `rankwise {' '.join(argv)}` does not parse (exit {e.code})")
    assert shown, f"{page.name} shows no rankwise command"


@pytest.mark.multiproc
def test_help_runs():
    proc = rankwise("--help", env=_env(), timeout=120)
    assert proc.returncode == 0 and "rankwise train" in proc.stdout, proc.stderr


@pytest.mark.multiproc
def test_the_quick_start_training_command_runs(tmp_path):
    """The first-run page's small `rankwise train` line, exactly as shown, with only --out added."""
    small = [
        argv
        for argv in rankwise_commands(FIRST_RUN)
        if argv[0] == "train" and "--max-steps" in argv
    ]
    assert small, "the quick start lost its small training command"
    proc = rankwise(*small[0], "--out", str(tmp_path / "run"), env=_env(), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json_summary(proc)
    assert summary["world_size"] == 2 and summary["steps"] == 6


def ported_loop(page: Path = PORTING) -> str:
    """The loop after porting: the diff's context and added lines, with a tiny model and dataset in
    front."""
    diff = code_blocks(page, ("diff",))[0]
    kept = [line[1:] for line in diff.splitlines() if line[:1] in (" ", "+")]
    prelude = """
from types import SimpleNamespace

import torch
from torch import nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, x, y):
        # like a transformers output
        return SimpleNamespace(loss=nn.functional.mse_loss(self.layer(x), y))

def build_model():
    return Model()

generator = torch.Generator().manual_seed(0)
features = torch.randn(256, 4, generator=generator)
train_set = [{"x": x, "y": x.sum(0, keepdim=True)} for x in features]
epochs = 2
"""
    return prelude + "\n".join(kept) + "\n"


@pytest.mark.multiproc
@pytest.mark.parametrize("page", [PORTING, README], ids=["porting", "readme"])
def test_the_ported_loop_runs_on_two_ranks_like_one_process(page, tmp_path):
    """The diff's '+' side is a working program: on 2 ranks it ends at the weights one process
    reaches."""
    script = tmp_path / "ported.py"
    script.write_text(ported_loop(page), encoding="utf-8")
    results = {}
    for name, launcher in (
        ("two", command("launch", "--nproc-per-node", "2")),
        ("one", [sys.executable]),
    ):
        run_dir = tmp_path / name
        run_dir.mkdir()
        proc = subprocess.run(
            [*launcher, str(script)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=180,
            cwd=run_dir,
        )
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
        results[name] = load_file(str(run_dir / "model.safetensors"))
    assert set(results["one"]) == {"layer.weight", "layer.bias"}  # unwrapped
    assert max_param_diff(results["two"], results["one"]) < 1e-5


def test_the_readme_links_only_to_files_in_the_repository():
    for target in re.findall(r"\]\(([^)#]+)", README.read_text(encoding="utf-8")):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), (
                f"README links to {target}, which is not in the repository"
            )
