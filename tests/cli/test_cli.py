import json
import re
from pathlib import Path

import pytest
import torch

from rankwise import cli
from rankwise.train import run
from tests.support.cli import json_summary, rankwise, tiny_text
from tests.support.tiers import starts_processes


def _train_small_ddp(out: Path, *extra: str) -> dict:
    proc = rankwise(
        "train",
        *tiny_text(),
        "--strategy",
        "ddp",
        "--nproc-per-node",
        "2",
        "--max-steps",
        "6",
        "--batch-size",
        "16",
        "--out",
        str(out),
        "--json",
        *extra,
    )
    assert proc.returncode == 0, proc.stderr
    return json_summary(proc)


@pytest.fixture(scope="module")
@starts_processes()
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    return out, _train_small_ddp(out)


def test_spawn_launcher_trains_exactly_like_torchrun(trained, tmp_path):
    from rankwise.checkpoint import read_weights

    summary = _train_small_ddp(tmp_path, "--launcher", "spawn")
    assert (summary["world_size"], summary["library_world_size"], summary["eval_samples"]) == (
        2,
        2,
        300,
    )
    torchrun, spawned = (
        read_weights(Path(p) / "checkpoints" / "latest") for p in (trained[0], tmp_path)
    )
    # same seed, same batches, same weights
    assert all(torch.equal(torchrun[k], spawned[k]) for k in torchrun)


def test_train_json_summary(trained):
    out, summary = trained
    required = {
        "strategy",
        "world_size",
        "train_samples",
        "eval_samples",
        "accuracy",
        "macro_f1",
        "wall_s",
        "samples_per_s",
        "checkpoint",
    }
    assert required <= summary.keys()
    assert (summary["strategy"], summary["world_size"], summary["library_world_size"]) == (
        "ddp",
        2,
        2,
    )
    assert (
        summary["train_samples"] == 300 and summary["eval_samples"] == 300 and summary["steps"] == 6
    )
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["samples_per_s"] > 0
    # The one steady step (6 steps, 5 of warm-up): its FLOPs over its time, against two ranks'
    # measured peak.
    assert summary["flops_per_sample"] > 1e6 and summary["peak_tflops_per_s"] > 0
    assert summary["tflops_per_s"] == pytest.approx(2 * summary["tflops_per_s_per_rank"], rel=2e-3)
    assert (
        0
        < summary["mfu"]
        == pytest.approx(summary["tflops_per_s"] / summary["peak_tflops_per_s"], rel=1e-2)
    )
    assert Path(summary["checkpoint"]).is_dir() and (out / "checkpoints" / "latest").exists()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # log_every=20 > steps: logged once, at the end
    assert [m["step"] for m in metrics if "loss" in m] == [6]
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tensorboard").iterdir())
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| negative |" in report and "| accuracy | | |" in report and "samples: 300" in report


def test_predict_matches_the_model(trained, capsys):
    out, _ = trained
    texts = ["这本书很好看", "质量太差了"]
    capsys.readouterr()
    assert (
        cli.main(["predict", "--checkpoint", str(out / "checkpoints" / "latest"), "--json", *texts])
        == 0
    )
    predicted = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]

    # Rebuild the model independently of rankwise.train.predict: transformers config + weights +
    # tokenizer file, and the bag-of-n-grams path by hand (CRC-32 of each 1-3-character substring,
    # as documented).
    import zlib

    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertForSequenceClassification

    ckpt = (out / "checkpoints" / "latest").resolve()
    spec = json.loads((ckpt / "model_spec.json").read_text())
    config = BertConfig(**{k: v for k, v in spec["config"].items() if k != "model_type"})
    model = BertForSequenceClassification(config).eval()
    weights = load_file(str(ckpt / "model.safetensors"))
    model.load_state_dict(
        {k.removeprefix("bert."): v for k, v in weights.items() if k.startswith("bert.")}
    )
    ngram_weights, buckets = weights["ngrams.weight"], spec["ngrams"]["buckets"]
    tokenizer = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    labels = json.loads((ckpt / "labels.json").read_text())
    for text, row in zip(texts, predicted):
        ids = torch.tensor([tokenizer.encode(text).ids])
        grams = [
            1 + zlib.crc32(text[i : i + n].encode("utf-32-le")) % (buckets - 1)
            for n in (1, 2, 3)
            for i in range(len(text) - n + 1)
        ]
        with torch.no_grad():
            wide = ngram_weights[grams].sum(0) / len(grams) ** 0.5 * 10.0
            probs = (model(input_ids=ids).logits + wide).softmax(-1)[0]
        assert row["text"] == text
        assert row["label"] == labels[int(probs.argmax())]
        assert row["probability"] == pytest.approx(float(probs.max()), abs=1e-5)


def test_bad_data_fails_before_any_worker_is_spawned(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text('text,label\n很好,pos\n"unterminated,neg\n', encoding="utf-8")
    monkeypatch.setattr(run, "launch_workers", lambda *a: pytest.fail("workers were launched"))
    code = cli.main(
        [
            "train",
            "--data",
            str(bad),
            "--strategy",
            "ddp",
            "--nproc-per-node",
            "2",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"{bad}:3: malformed row" in err
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.mark.multiproc
def test_bad_data_exit_code_from_the_command_line(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_bytes("text\tlabel\n好\tpos\n".encode() + "坏\tneg\n".encode("gbk"))
    proc = rankwise(
        "train", "--data", str(bad), "--strategy", "ddp", "--nproc-per-node", "2", timeout=60
    )
    assert proc.returncode == 2 and f"{bad}:3: not valid UTF-8" in proc.stderr
    assert "torch.distributed" not in proc.stderr  # nothing was launched


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "optim.lrr=1"], "did you mean 'optim.lr'"),
        (
            ["--batch-size", "30", "--strategy", "ddp", "--nproc-per-node", "4"],
            "not divisible by world_size (4)",
        ),
        (["--strategy", "single", "--nproc-per-node", "2"], "runs in one process"),
        (
            [
                "--strategy",
                "deepspeed",
                "--nproc-per-node",
                "2",
                "--set",
                "deepspeed.config_file=/nonexistent/ds.json",
            ],
            "deepspeed.config_file='/nonexistent/ds.json'",
        ),
        (
            [
                "--strategy",
                "deepspeed",
                "--nproc-per-node",
                "2",
                "--set",
                "deepspeed.offload_param=true",
            ],
            "offload_param needs deepspeed.zero_stage=3",
        ),
        (["--model", "tiny"], "model 'tiny' reads text: use --model linear or mlp"),
        (
            ["--model", "tinyy", "--strategy", "ddp", "--nproc-per-node", "2"],
            "'tinyy': not a preset",
        ),
        (["--set", "optim.lr=fast"], "optim.lr: Input should be a valid number"),
        (
            ["--set", "precision=fp8"],
            "precision: Input should be '32-true', 'bf16-mixed' or '16-mixed'",
        ),
        (
            [
                "--set",
                "data.toy_samples=8",
                "--strategy",
                "ddp",
                "--nproc-per-node",
                "8",
                "--batch-size",
                "16",
            ],
            "the training split has 8 samples, fewer than one global batch (16)",
        ),
        (
            [
                "--set",
                "data.toy_samples=8",
                "--strategy",
                "ddp",
                "--nproc-per-node",
                "8",
                "--batch-size",
                "8",
            ],
            "eval_split='test': the test split of toy is empty",
        ),
    ],
)
def test_bad_config_is_a_clear_error(args, message, monkeypatch, capsys):
    monkeypatch.setattr(run, "launch_workers", lambda *a: pytest.fail("workers were launched"))
    assert cli.main(["train", "--data", "toy", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 autocast is allowed on CUDA")
def test_fp16_without_cuda_is_refused_before_launch(monkeypatch, capsys):
    monkeypatch.setattr(run, "launch_workers", lambda *a: pytest.fail("workers were launched"))
    assert (
        cli.main(
            [
                "train",
                "--data",
                "toy",
                "--strategy",
                "ddp",
                "--nproc-per-node",
                "2",
                "--precision",
                "16-mixed",
            ]
        )
        == 2
    )
    assert "precision 16-mixed needs a CUDA device" in capsys.readouterr().err


def test_help_reads_like_a_manual(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = capsys.readouterr().out
    assert "ddp" in text and "optim.lr" in text and "Outputs" in text
    assert cli.main(["launch", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--nproc-per-node" in text
    listed = {
        line.split()[0]
        for line in text.split("Strategies:")[1].split("torchrun's flags")[0].splitlines()
        if line.startswith("  ") and not line.strip().startswith("not started")
    }
    assert "ddp" in listed and "fsdp" in listed and not listed & {"ddp-spawn", "horovod"}
    assert (
        "not started by `rankwise launch`: ddp-spawn (spawn)" in text
        and "horovod (horovodrun)" in text
    )
    assert "dp " in text and "(one process: --nproc-per-node 1)" in text


def test_train_refuses_to_run_inside_a_launched_worker(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["train", "--data", "toy"]) == 2
    assert "starts its own workers" in capsys.readouterr().err


@pytest.mark.parametrize(
    "strategy, module, install",
    [
        ("deepspeed", "deepspeed", "pip install 'rankwise[deepspeed]'"),
        ("accelerate", "accelerate", "pip install 'rankwise[accelerate]'"),
        ("horovod", "horovod", "scripts/build_horovod.sh"),
    ],
)
def test_missing_strategy_library_names_the_install_command(
    strategy, module, install, monkeypatch, capsys
):
    import importlib.util

    import rankwise

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.split(".")[0] == module else real(name, *a),
    )
    assert (
        cli.main(["train", "--data", "toy", "--strategy", strategy, "--nproc-per-node", "2"]) == 2
    )
    assert install in capsys.readouterr().err
    # The Python API says the same, as an ImportError, before touching any process group.
    with pytest.raises(ImportError, match=re.escape(install)):
        rankwise.setup(strategy)


def test_export_then_predict_and_init_from_it(trained, tmp_path, capsys):
    out, _ = trained
    exported = tmp_path / "model.safetensors"
    assert cli.main(["export", "--checkpoint", str(out), "--out", str(exported)]) == 0
    texts = ["这本书很好看", "质量太差了"]
    capsys.readouterr()
    assert cli.main(["predict", "--checkpoint", str(exported), "--json", *texts]) == 0
    from_export = capsys.readouterr().out
    assert (
        cli.main(["predict", "--checkpoint", str(out / "checkpoints" / "latest"), "--json", *texts])
        == 0
    )
    assert from_export == capsys.readouterr().out and from_export.count("\n") == 2

    from rankwise.checkpoint import read_weights
    from rankwise.data.prepare import PreparedData
    from rankwise.runtime import setup
    from rankwise.train.config import build_config
    from rankwise.train.loop import Trainer

    cfg = build_config(
        overrides=["strategy=single", f"model.init_weights={exported}", "data.max_length=32"]
    )
    with setup("single") as rt:
        trainer = Trainer(cfg, PreparedData.load(out / "data"), tmp_path / "init", rt)
        start = trainer.model.state_dict()
    weights = read_weights(exported)
    assert all(torch.equal(start[k], weights[k]) for k in weights)


def test_predict_rejects_a_foreign_file(tmp_path, capsys):
    plain = tmp_path / "plain.safetensors"
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(plain))
    assert cli.main(["predict", "--checkpoint", str(plain), "x"]) == 2
    assert "no rankwise metadata" in capsys.readouterr().err


def test_a_master_port_in_use_is_named_before_launch(monkeypatch, capsys):
    import socket

    monkeypatch.setattr(run, "launch_workers", lambda *a: pytest.fail("workers were launched"))
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(
            [
                "train",
                "--data",
                "toy",
                "--strategy",
                "ddp",
                "--nproc-per-node",
                "2",
                "--master-port",
                str(port),
            ]
        )
    assert code == 2
    assert (
        f"launch.master_port: 127.0.0.1:{port} is already in use on this node"
        in capsys.readouterr().err
    )


def test_a_resume_on_changed_data_or_a_corrupted_order_digest_is_refused_before_launch(
    tmp_path, capsys
):
    """The checkpoint's manifest records the training data's digest and the sample order: a changed
    data file or an edited order digest is refused before any worker starts, and the run's prepared
    data is kept."""
    data = tmp_path / "reviews.csv"
    rows = [
        f"{'好看值得一读' if i % 2 else '太差了不买'}{i},{'pos' if i % 2 else 'neg'}"
        for i in range(120)
    ]
    data.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    args = [
        "train",
        "--data",
        str(data),
        "--strategy",
        "single",
        "--model",
        "tiny",
        "--batch-size",
        "16",
        "--max-steps",
        "4",
        "--set",
        "save_every=2",
        "--set",
        "data.tokenizer=char",
        "--set",
        "data.max_length=16",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert cli.main(args) == 0
    meta = json.loads((out / "checkpoints" / "latest" / "manifest.json").read_text())["meta"]
    assert meta["continuity"]["position"] == 4 * 16 and meta["continuity"]["step"] == 4
    prepared = (out / "data" / "prepared.pt").read_bytes()
    data.write_text(
        "text,label\n" + "\n".join(rows[:-1] + ["又好看又便宜,pos"]) + "\n", encoding="utf-8"
    )
    capsys.readouterr()
    assert cli.main([*args, "--resume", "latest", "--max-steps", "6"]) == 2
    err = capsys.readouterr().err
    assert "the training data changed since this checkpoint" in err and str(data) in err, err
    assert (out / "data" / "prepared.pt").read_bytes() == prepared  # the run's own data is kept
    data.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    manifest = out / "checkpoints" / "latest" / "manifest.json"
    record = json.loads(manifest.read_text())
    record["meta"]["continuity"]["order"] = "0" * 16
    manifest.write_text(json.dumps(record))
    assert cli.main([*args, "--resume", "latest", "--max-steps", "6"]) == 2
    assert "its sample order is not this run's" in capsys.readouterr().err


@pytest.mark.multiproc
def test_same_command_same_weights_and_tokenizer(tmp_path):
    """Data preparation included: two fresh runs of the same command end bitwise equal."""
    from rankwise.checkpoint import read_weights

    def run(out):
        proc = rankwise(
            "train",
            "--data",
            "sentiment",
            "--strategy",
            "ddp",
            "--nproc-per-node",
            "2",
            "--max-steps",
            "8",
            "--batch-size",
            "16",
            "--seed",
            "7",
            "--out",
            str(out),
            "--json",
            "--set",
            "data.limit=600",
            "--set",
            "data.max_length=32",
            "--set",
            "data.vocab_size=1500",
            "--set",
            "eval_batch_size=64",
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return read_weights(out / "checkpoints" / "latest"), (
            out / "data" / "tokenizer.json"
        ).read_bytes()

    (first, first_tokenizer), (second, second_tokenizer) = run(tmp_path / "a"), run(tmp_path / "b")
    assert first_tokenizer == second_tokenizer
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize(
    "argv", [["--hostfile"], ["--hostfile", "--nproc-per-node=2", "x.py"], ["--hostfile=", "x.py"]]
)
def test_launch_hostfile_without_a_file_is_an_error(argv, capsys):
    assert cli.main(["launch", *argv]) == 2
    assert "--hostfile needs a file" in capsys.readouterr().err


def test_launch_reads_the_hostfile_in_the_equals_form(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("127.0.0.1 slots=2\n", encoding="utf-8")
    seen = []
    monkeypatch.setattr(
        "rankwise.cli.launch.launch_command_line", lambda argv, parser: seen.append(argv)
    )
    assert cli.main(["launch", f"--hostfile={hosts}", "x.py"]) == 0
    assert (
        "--nproc-per-node=2" in seen[0]
        and seen[0][-1] == "x.py"
        and not any("hostfile" in a for a in seen[0])
    )


def test_an_error_names_the_command_whatever_the_run_is_called(capsys):
    """`--name` is the run's name, not the command's: the message still says `rankwise train`."""
    assert (
        cli.main(
            [
                "train",
                "--data",
                "toy",
                "--name",
                "mine",
                "--strategy",
                "ddp",
                "--nproc-per-node",
                "2",
                "--batch-size",
                "3",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.startswith(
        "rankwise train: error: batch_size=3 is not divisible"
    )


def test_more_ranks_than_gpus_is_refused_before_launch(monkeypatch, capsys):
    """Seen on a one-GPU H100 machine: two ranks on it failed in the DDP wrap with NCCL's "Duplicate
    GPU detected".  Refused before any worker starts, for `train` and for a script under `launch
    --strategy`."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(run, "launch_workers", lambda *a: pytest.fail("workers were launched"))
    assert cli.main(["train", "--data", "toy", "--strategy", "ddp", "--nproc-per-node", "2"]) == 2
    err = capsys.readouterr().err
    assert (
        "2 processes per node but this node has 1 CUDA GPU" in err
        and "CUDA_VISIBLE_DEVICES=" in err
    ), err
    launched = []
    monkeypatch.setattr(
        "rankwise.cli.launch.launch_command_line", lambda argv, parser: launched.append(argv)
    )
    assert cli.main(["launch", "--nproc-per-node", "2", "--strategy", "fsdp", "x.py"]) == 2
    assert "--nproc-per-node: 2 processes per node" in capsys.readouterr().err and not launched
    # Without --strategy the script may be any torchrun script (gloo on the CPU, say): launch does
    # not guess.
    assert cli.main(["launch", "--nproc-per-node", "2", "x.py"]) == 0 and launched


def test_speed_settings_a_run_cannot_use_are_refused_before_launch(monkeypatch, capsys):
    monkeypatch.setattr(run, "launch_workers", lambda *a: pytest.fail("workers were launched"))
    assert cli.main(["train", "--data", "toy", "--strategy", "dp", "--set", "compile=true"]) == 2
    assert "strategy 'dp' cannot use torch.compile" in capsys.readouterr().err
    assert cli.main(["train", "--data", "toy", "--set", "model.activation_checkpointing=true"]) == 2
    assert "model linear has none" in capsys.readouterr().err


def test_a_scripts_own_flag_is_never_taken_for_an_abbreviated_launch_flag():
    """`rankwise launch script.py --even` once failed: 'ambiguous option: --even could match
    --event-log-handler'."""
    from rankwise.cli.launch import command_line_parser

    flags, _ = command_line_parser().parse_known_args(
        ["--nproc-per-node", "2", "train.py", "--even", "--nproc", "3"]
    )
    assert flags.training_script == "train.py" and flags.training_script_args == [
        "--even",
        "--nproc",
        "3",
    ]
    assert flags.nproc_per_node == "2"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--"], "unexpected arguments -- (only --script takes arguments after --)"),
        (["--", "--x"], "unexpected arguments -- --x"),
        (["--nproc", "1,2"], "--nproc: one process count"),
        (["--nproc", "1", "--script", "missing.py"], "--nproc must be at least 2"),
        (["--script", "missing.py"], f"--script {Path.cwd() / 'missing.py'}: no such file"),
    ],
)
def test_bench_refuses_bad_flags_before_anything_runs(args, message, monkeypatch, capsys):
    """The flags become typed settings in cli/; what the tools refuse, and in which order, is what
    `rankwise bench` refused when the tools read the namespace itself."""
    from rankwise.tools.bench import suite

    monkeypatch.setattr(suite, "run_all", lambda *a, **k: pytest.fail("rows were run"))
    assert cli.main(["bench", *args]) == 2
    assert message in capsys.readouterr().err
