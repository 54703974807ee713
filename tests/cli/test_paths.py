"""Paths a user types are made absolute in cli/ (rankwise.cli.paths): unit tests of the rules, and
each command run from a directory of the user's with relative paths, as a user types them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankwise.cli import build_parser, paths
from rankwise.cli.bench import Output
from rankwise.cli.train import config_from
from tests.support.cli import command_env, json_summary, rankwise


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """A user's directory, not the repository's: the working directory of the test."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.csv").write_text("text,label\n好,1\n差,0\n", encoding="utf-8")
    (tmp_path / "model").mkdir()
    return tmp_path


def test_a_path_key_is_made_absolute_and_a_name_is_left(elsewhere):
    assert paths.config_value("out", "runs/x") == str(elsewhere / "runs/x")
    assert paths.config_value("data.cache_dir", "cache") == str(elsewhere / "cache")
    # name-or-path keys: a name stays, a path that exists here is resolved, one that does not is
    # left for the config's own check to name as the user wrote it
    assert paths.config_value("data.source", "sentiment") == "sentiment"
    assert paths.config_value("data.source", "data.csv") == str(elsewhere / "data.csv")
    assert paths.config_value("data.source", "missing.csv") == "missing.csv"
    assert paths.config_value("model.name", "tiny") == "tiny"
    assert paths.config_value("model.name", "model") == str(elsewhere / "model")
    assert paths.config_value("resume", "latest") == "latest"
    assert paths.config_value("seed", "3") == "3"  # not a path key


def test_a_name_is_not_taken_for_a_file_of_that_name(elsewhere):
    (elsewhere / "sentiment").write_text("", encoding="utf-8")
    assert paths.config_value("data.source", "sentiment") == "sentiment"


def test_set_overrides_get_absolute_values_quoted_for_the_config_parser(elsewhere):
    assert paths.overrides(["out=runs/a", 'data.cache_dir="c d"', "seed=1", "model.name=tiny"]) == [
        f"out={json.dumps(str(elsewhere / 'runs/a'))}",
        f"data.cache_dir={json.dumps(str(elsewhere / 'c d'))}",
        "seed=1",
        "model.name=tiny",
    ]


def test_a_scripts_arguments_that_name_files_here_become_absolute(elsewhere):
    assert paths.script_arguments(["data.csv", "--data=data.csv", "--lr", "1e-3", "-x=3"]) == (
        str(elsewhere / "data.csv"),
        f"--data={elsewhere / 'data.csv'}",
        "--lr",
        "1e-3",
        "-x=3",
    )


def test_train_resolves_flags_set_and_the_config_file(elsewhere):
    (elsewhere / "run.toml").write_text('out = "from-file"\n', encoding="utf-8")
    args = build_parser().parse_args(
        ["train", "--data", "data.csv", "--config", "run.toml", "--set", "data.cache_dir=c"]
    )
    cfg = config_from(args)
    assert cfg.out == str(elsewhere / "from-file")
    assert cfg.data.source == str(elsewhere / "data.csv")
    assert cfg.data.cache_dir == str(elsewhere / "c")


def test_bench_verify_and_plan_settings_hold_absolute_paths(elsewhere, monkeypatch):
    from rankwise.cli import bench, plan, verify
    from rankwise.tools.bench import suite, user_script

    (elsewhere / "s.py").write_text("", encoding="utf-8")
    seen: dict[str, object] = {}
    monkeypatch.setattr(suite, "bench", lambda config: seen.setdefault("suite", config) and 0)
    monkeypatch.setattr(
        user_script, "bench", lambda config: seen.setdefault("script", config) and 0
    )
    parser = build_parser()
    bench.run(parser.parse_args(["bench", "--out", "b", "--data", "data.csv", "--set", "out=o"]))
    suite_settings = seen["suite"]
    assert suite_settings.output == Output(out=elsewhere / "b", explain=None, as_json=False)
    assert suite_settings.data == str(elsewhere / "data.csv")
    assert suite_settings.overrides == (f"out={json.dumps(str(elsewhere / 'o'))}",)
    bench.run(parser.parse_args(["bench", "--script", "s.py", "--", "data.csv"]))
    script_settings = seen["script"]
    assert script_settings.script == elsewhere / "s.py"
    assert script_settings.script_args == (str(elsewhere / "data.csv"),)
    assert script_settings.output.out.is_absolute()
    settings = verify.settings_from(
        verify.parse_rest(parser.parse_args(["verify", "s.py", "--out", "v", "--", "data.csv"]))
    )
    assert (settings.script, settings.out) == (elsewhere / "s.py", elsewhere / "v")
    assert settings.script_args == (str(elsewhere / "data.csv"),)
    planned = plan.config_from(plan.parse_rest(parser.parse_args(["plan", "s.py"])))
    assert planned.script == elsewhere / "s.py" and planned.out.is_absolute()


SCRIPT = """
import sys
import torch
import rankwise

rows = open(sys.argv[1], encoding="utf-8").read().split()  # a relative file the user named
with rankwise.setup(seed=0) as rt:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = rt.prepare(model, optimizer)
    data = [{"x": torch.randn(4), "y": torch.randn(1)} for _ in range(64 * len(rows))]
    loader = rt.loader(data, batch_size=16, shuffle=True)
    for batch in loader:
        batch = rt.to_device(batch)
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        rt.backward(loss, model)
        rt.step(optimizer, model)
        rt.zero_grad(optimizer)
"""


@pytest.mark.multiproc
def test_commands_from_another_directory_with_relative_paths(tmp_path):
    """From a directory that is not the repository, every path relative: train (its data file, its
    run directory), export and predict (its checkpoint), verify (the script and a file its argument
    names, its report) and bench (its report directory: the equivalence checks run elsewhere and
    read the data prepared under it -- `make demo`'s failure)."""
    user = tmp_path / "me"
    user.mkdir()
    lines = [f"好看 喜欢 {i},pos" if i % 2 else f"太差 失望 {i},neg" for i in range(120)]
    (user / "reviews.csv").write_text("text,label\n" + "\n".join(lines) + "\n", encoding="utf-8")
    (user / "script.py").write_text(SCRIPT, encoding="utf-8")
    (user / "rows.txt").write_text("a b\n", encoding="utf-8")
    env = command_env()

    def run(*args: str, timeout: float = 300):
        proc = rankwise(*args, env=env, timeout=timeout, cwd=user)
        assert proc.returncode == 0, f"rankwise {' '.join(args)}:\n{proc.stderr[-3000:]}"
        return proc

    trained = json_summary(
        run(
            "train", "--data", "reviews.csv", "--strategy", "ddp", "--nproc-per-node", "2",
            "--max-steps", "2", "--set", "data.tokenizer=char", "--set", "data.max_length=16",
            "--out", "runs/t", "--json", "--no-progress",
        )
    )  # fmt: skip
    assert trained["world_size"] == 2 and (user / "runs/t/metrics.jsonl").exists()
    run("export", "--checkpoint", "runs/t/checkpoints/latest", "--out", "weights.safetensors")
    assert (user / "weights.safetensors").exists()
    verdict = json.loads(
        run(
            "verify",
            "script.py",
            "--strategy",
            "ddp",
            "--steps",
            "2",
            "--out",
            "v",
            "--json",
            "--",
            "rows.txt",
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    assert verdict["verdict"] == "equivalent" and (user / "v/verify.json").exists()
    benched = json.loads(
        run(
            "bench", "--strategies", "ddp", "--data", "toy", "--out", "b", "--json",
            "--no-progress", "--set", "max_steps=12", timeout=600,
        ).stdout.strip().splitlines()[-1]
    )  # fmt: skip
    rows = {row["row"]: row for row in benched["rows"]}
    assert rows["ddp"]["verdict"] == "equivalent", rows["ddp"].get("reason")
    assert benched["reading"]["not_run"] == [] and (user / "b/report.json").exists()
