import pytest

from rankwise.train.config import (
    ConfigError,
    apply_override,
    build_config,
    describe_fields,
    parse_value,
)


def test_defaults_validate():
    cfg = build_config()
    assert cfg.strategy == "single" and cfg.data.source == "sentiment"


def test_file_then_set_then_flags(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        'strategy = "ddp"\nepochs = 5\n[optim]\nlr = 0.1\n[data]\nmax_length = 64\n',
        encoding="utf-8",
    )
    cfg = build_config(
        path, ["optim.lr=0.5", "data.max_length=32"], {"data.max_length": 16, "epochs": None}
    )
    assert (cfg.strategy, cfg.epochs, cfg.optim.lr, cfg.data.max_length) == ("ddp", 5, 0.5, 16)


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(
        ConfigError, match=r"unknown config key 'optim.lrr'.*did you mean 'optim.lr'"
    ):
        build_config(overrides=["optim.lrr=1"])


def test_unknown_key_in_file_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[optim]\nwarmup = 0.1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.toml: unknown config key 'optim.warmup'"):
        build_config(path)


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"optim.lr: Input should be a valid number"):
        build_config(overrides=["optim.lr=fast"])
    with pytest.raises(ConfigError, match=r"epochs"):
        build_config(overrides=["epochs=0"])


def test_unknown_strategy_and_cross_field_checks():
    with pytest.raises(ConfigError, match="unknown strategy 'horovd'"):
        build_config(overrides=["strategy=horovd"])
    with pytest.raises(ConfigError, match="node_rank"):
        build_config(overrides=["launch.nnodes=2", "launch.node_rank=2"])
    with pytest.raises(ConfigError, match="model.split_devices .* strategy=fsdp"):
        build_config(overrides=["model.name=mlp", "model.split_devices=true", "strategy=fsdp"])
    with pytest.raises(ConfigError, match="model.split_devices .* model.name=tiny"):
        build_config(overrides=["model.split_devices=true", "strategy=ddp"])
    assert build_config(
        overrides=["model.name=mlp", "model.split_devices=true", "strategy=ddp"]
    ).model.split_devices


def test_an_elastic_node_range_needs_a_rendezvous_and_fits_every_world_size():
    from rankwise.train.preflight import before_launch

    rdzv = ["launch.rdzv_backend=c10d", "launch.rdzv_endpoint=h:29400"]
    cfg = build_config(overrides=['launch.nnodes="1:3"', "launch.nproc_per_node=2", *rdzv])
    assert (cfg.launch.node_range, cfg.world_sizes, cfg.world_size) == ((1, 3), [2, 4, 6], 6)
    assert build_config(overrides=['launch.nnodes="2:2"']).launch.nnodes == 2
    with pytest.raises(ConfigError, match="needs torchrun's rendezvous: --rdzv-backend c10d"):
        build_config(overrides=['launch.nnodes="1:2"'])
    with pytest.raises(ConfigError, match="MIN:MAX with 1 <= MIN <= MAX, got '3:1'"):
        build_config(overrides=['launch.nnodes="3:1"', *rdzv])
    # batch 8 fits 2 and 4 ranks, not 6
    with pytest.raises(ConfigError, match=r"batch_size=8 is not divisible by world_size \(6\)"):
        before_launch(
            build_config(
                overrides=[
                    'launch.nnodes="1:3"',
                    "launch.nproc_per_node=2",
                    "batch_size=8",
                    "strategy=ddp",
                    *rdzv,
                ]
            )
        )
    with pytest.raises(
        ConfigError, match="elastic node range needs the torchrun launcher .* spawn"
    ):
        before_launch(
            build_config(
                overrides=['launch.nnodes="1:2"', "launch.launcher=spawn", "strategy=ddp", *rdzv]
            )
        )


def test_batch_must_divide_world_and_accumulation():
    cfg = build_config(overrides=["batch_size=30", "grad_accum=2"])
    assert cfg.micro_batch_size(3) == 5
    with pytest.raises(
        ConfigError, match="not divisible by world_size \\(4\\) x grad_accum \\(2\\)"
    ):
        cfg.micro_batch_size(4)


def test_set_value_parsing():
    assert parse_value("3") == 3 and parse_value("1e-3") == 1e-3 and parse_value("true") is True
    assert parse_value("hello") == "hello" and parse_value('"a b"') == "a b"
    assert parse_value("[0.9, 0.99]") == [0.9, 0.99]


def test_section_cannot_be_set_whole():
    with pytest.raises(ConfigError, match="is a section"):
        apply_override({}, "optim", 1)


def test_every_field_is_documented():
    rows = describe_fields()
    undocumented = [key for key, _, doc in rows if not doc]
    assert rows and not undocumented


def test_defaults_that_follow_other_settings(tmp_path):
    assert build_config(overrides=["data.source=toy"]).model.name == "linear"  # not a text model
    assert build_config(overrides=["data.source=toy", "model.name=mlp"]).model.name == "mlp"
    (tmp_path / "bert").mkdir()
    cfg = build_config(overrides=[f"model.name={tmp_path / 'bert'}"])
    # a pretrained model reads its own token ids
    assert cfg.data.tokenizer == str(tmp_path / "bert")
    explicit = build_config(overrides=[f"model.name={tmp_path / 'bert'}", "data.tokenizer=bpe"])
    assert explicit.data.tokenizer == "bpe"
    # The saved config (what workers load) keeps the resolved values.
    import json

    from rankwise.train.config import validate

    assert validate(json.loads(cfg.to_json())).data.tokenizer == str(tmp_path / "bert")


def test_a_damaged_latest_is_left_to_the_workers_fallback_unless_strict(tmp_path):
    from rankwise.train.preflight import resumable

    (tmp_path / "step-00000002").mkdir()
    (tmp_path / "step-00000002" / "manifest.json").write_text("{truncated", encoding="utf-8")
    (tmp_path / "latest").symlink_to("step-00000002")
    # no error
    resumable(build_config(overrides=[f"resume={str(tmp_path / 'latest')!r}", "strategy=ddp"]))
    with pytest.raises(ConfigError, match="unreadable manifest.json"):
        resumable(
            build_config(
                overrides=[f"resume={str(tmp_path / 'latest')!r}", "strategy=ddp", "strict=true"]
            )
        )
    with pytest.raises(ConfigError, match="--resume"):
        resumable(build_config(overrides=[f"resume={str(tmp_path / 'nothing')!r}"]))
