"""Run configuration: typed, validated, one docstring per field.

One channel: a TOML file (``--config run.toml``), then ``--set section.key=value``
overrides, then the CLI's own flags, all merged into one dict and validated once by
:class:`TrainConfig`.  Unknown keys and wrong types are reported with their dotted
key, e.g. ``optim.lr: Input should be a valid number``.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rankwise.errors import ConfigError
from rankwise.launch.config import LAUNCHERS, LaunchConfig
from rankwise.models import TOY_MODELS, model_names
from rankwise.precision import PrecisionName
from rankwise.sampling.batching import micro_batch_size
from rankwise.strategies import lookup, strategy_names
from rankwise.strategies.options import (
    DDPOptions,
    DeepSpeedOptions,
    HorovodOptions,
    Options,
    parse_value,
)

__all__ = [
    "ConfigError",
    "DataConfig",
    "LAUNCHERS",
    "TrainConfig",
    "build_config",
    "describe_fields",
    "load_config_json",
]


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True
    )


class DataConfig(_Section):
    source: str = "sentiment"
    """`sentiment` (built-in Chinese reviews), `toy` (random features) or a path to a
    .csv/.tsv/.jsonl file."""
    text_column: str = "text"
    """Column (CSV/TSV header name or JSONL key) holding the text."""
    label_column: str = "label"
    """Column holding the label; any strings, e.g. 其他/喜好/悲伤."""
    split_column: str | None = None
    """Optional column with train/dev/test per row; without it rows are split by a hash of the
    text."""
    drop_duplicates: bool | None = None
    """Drop exact duplicate rows and texts seen with two labels before splitting. Default: yes when
    rankwise splits by text hash, no when `split_column` gives the split (kept as given; duplicates
    and train/test leakage are reported as warnings)."""
    dev_percent: int = Field(5, ge=0, le=50)
    """Share of rows (by text hash) that go to the dev split."""
    test_percent: int = Field(10, ge=1, le=50)
    """Share of rows (by text hash) that go to the test split."""
    limit: int | None = Field(None, ge=1)
    """Keep N rows of each split (a fixed hash-ordered sample) for quick runs and tests."""
    tokenizer: str = "bpe"
    """`bpe` or `wordpiece` (subword vocabularies learned on the training split), `char` (one token
    per character) or a local HF tokenizer path; with a local pretrained `--model` the default is
    that model's own tokenizer."""
    vocab_size: int = Field(6000, ge=100)
    """Vocabulary size of a learned tokenizer (upper bound for `char`)."""
    max_length: int = Field(96, ge=8)
    """Tokens per text, [CLS] and [SEP] included; longer texts keep their first and last
    max_length/2 tokens."""
    char_ngrams: int = Field(3, ge=0, le=8)
    """Also give a BERT preset every character 1..N-gram of the whole text, hashed, for its
    bag-of-n-grams path (a linear classifier whose logits add to the transformer's); 0 = tokens
    only."""
    ngram_buckets: int = Field(2**18, ge=2)
    """Hash buckets of the character n-grams (the bag-of-n-grams path has buckets x labels
    weights)."""
    group_by_length: bool = True
    """Put training texts of similar length into the same global batch (less padding, about 2x
    faster on `sentiment`); the shuffle stays seeded and identical at every world size."""
    pad_to_multiple_of: int | None = Field(None, ge=1)
    """Pad each text batch to a multiple of this many tokens (its n-gram rows to a power of two),
    so a compiled model meets a few shapes, each compiled once with static kernels, and a GPU's
    matrix units get whole tiles. Default: 16 where the model runs on CUDA or compiles, else 1 (to
    the batch's longest text: least work on a CPU)."""
    toy_samples: int = Field(4096, ge=8)
    """Number of samples in the `toy` dataset."""
    toy_features: int = Field(10, ge=1)
    """Input features of the `toy` dataset."""
    toy_classes: int = Field(5, ge=2)
    """Classes of the `toy` dataset."""
    cache_dir: str | None = None
    """Keep the prepared data (splits, tokenizer, token ids) here, keyed by these data settings and
    the source file's size and modification time, and reuse it when they match: repeated runs skip
    reading and tokenizer training."""


class ModelConfig(_Section):
    name: str = "tiny"
    """`tiny`, `small`, `base`, `large` (BERT presets trained from scratch), `linear` / `mlp` (toy
    models) or a local pretrained path; `linear` by default with `--data toy`."""
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    """Dropout in the BERT presets and toy MLP; set 0 for bit-comparable equivalence runs."""
    init_weights: str | None = None
    """Start from these weights: a `rankwise export` .safetensors file or a checkpoint directory
    (any strategy's)."""
    pooling: Literal["cls", "mean"] = "cls"
    """How a BERT preset summarises a text for its classifier: the [CLS] state through BERT's
    pooler, or the mean of the non-padding token states."""
    activation_checkpointing: bool = False
    """Recompute each transformer layer's activations in the backward pass instead of keeping them:
    activation memory drops to about one layer's worth, for about one more forward pass of compute
    (under every strategy)."""
    split_devices: bool = False
    """Split the toy MLP across two devices inside one rank (a model-parallel MLP inside data
    parallelism, as in PyTorch's DDP tutorial's ToyMpModel): rank r uses cuda:2r and cuda:2r+1 (the
    CPU twice without GPUs); model mlp with strategy single or ddp only."""


class OptimConfig(_Section):
    lr: float = Field(1e-3, gt=0)
    """Peak learning rate of AdamW."""
    weight_decay: float = Field(0.01, ge=0)
    """AdamW weight decay; never applied to biases and LayerNorm weights."""
    betas: tuple[float, float] = (0.9, 0.98)
    """AdamW betas."""
    eps: float = Field(1e-6, gt=0)
    """AdamW epsilon."""
    warmup_ratio: float = Field(0.1, ge=0, le=1)
    """Fraction of the optimizer steps spent warming the learning rate up linearly from 0."""
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    """Decay after warm-up."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this value; null disables clipping."""
    label_smoothing: float = Field(0.1, ge=0, lt=1)
    """Label smoothing of the cross-entropy loss."""


class TrainConfig(_Section):
    strategy: str = "single"
    """Data-parallel strategy or variant (e.g. `deepspeed-zero3`): see `rankwise train --help` for
    the registered names."""
    precision: PrecisionName = "32-true"
    """Numeric precision: full fp32, or autocast to bf16 / fp16 (fp16 needs CUDA)."""
    epochs: int = Field(2, ge=1)
    """Passes over the training split (on `sentiment` a third epoch overfits: 3-seed mean test
    accuracy 0.854 after 2, 0.845 after 3)."""
    max_steps: int | None = Field(None, ge=1)
    """Stop after this many optimizer steps (overrides epochs when reached first)."""
    batch_size: int = Field(32, ge=1)
    """Global batch per optimizer step, the same whatever the world size: per-rank micro-batch =
    batch_size / (world_size * grad_accum)."""
    grad_accum: int = Field(1, ge=1)
    """Micro-batches accumulated per optimizer step (gradient sync only on the last)."""
    compile: bool = False
    """Compile the model with torch.compile (inductor) after the strategy's wrapping; the first
    steps pay for the compilation (left out of steady_samples_per_s by throughput_warmup_steps), and
    dropout masks come from inductor's generator (not dp)."""
    throughput_warmup_steps: int = Field(5, ge=0)
    """Optimizer steps left out of the summary's `steady_samples_per_s` and `tokens_per_s` (the
    first steps pay for allocation and caches; checkpoints and evaluations are always left out)."""
    profile_steps: int = Field(0, ge=0)
    """The run's last optimizer steps, profiled (torch's profiler) for the summary's `breakdown`:
    each rank's step split into compute, exposed communication, data wait and waiting for the
    slowest rank (`rankwise bench` sets it; 0: none). They come after the timed window and are left
    out of the steady throughput (the profiler slows the steps after it)."""
    eval_batch_size: int = Field(256, ge=1)
    """Global batch for evaluation."""
    seed: int = 0
    """Seed for weights, shuffling and dropout; shuffling is identical on every rank."""
    out: str | None = None
    """Run directory; default runs/<name>."""
    name: str | None = None
    """Run name; default <data>-<strategy>-<timestamp>."""
    log_every: int = Field(20, ge=1)
    """Log (and all-reduce) the loss every N optimizer steps."""
    save_every: int | None = Field(None, ge=1)
    """Also checkpoint every N optimizer steps (a checkpoint is always written at each epoch
    end)."""
    save_at_steps: list[int] = []
    """Also checkpoint right after these optimizer steps (e.g. to compare runs at the same step)."""
    resume: str | None = None
    """Checkpoint directory to resume from (`latest` means <out>/checkpoints/latest)."""
    strict: bool = False
    """On resume, refuse a corrupt or truncated latest checkpoint instead of falling back to the
    previous one (with a warning)."""
    trust_checkpoint: bool = False
    """On resume, load pickled files that name classes rankwise does not know (which loading would
    import and run): only for a checkpoint from someone you trust (sets RANKWISE_TRUST_CHECKPOINT
    for the workers)."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many of the newest checkpoints to keep under <out>/checkpoints."""
    eval_split: Literal["dev", "test"] = "test"
    """Split evaluated at the end of training and reported."""
    dev_each_epoch: bool = True
    """Evaluate the dev split at each epoch end (logged as dev_accuracy / dev_macro_f1)."""
    progress: bool = True
    """Show a tqdm progress bar on rank 0."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Data and tokenizer."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """Model."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    ddp: DDPOptions = Field(default_factory=DDPOptions)
    """DistributedDataParallel options (also the DDP wrapper Accelerate creates)."""
    deepspeed: DeepSpeedOptions = Field(default_factory=DeepSpeedOptions)
    """DeepSpeed options."""
    horovod: HorovodOptions = Field(default_factory=HorovodOptions)
    """Horovod options."""
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    """Process launch."""

    @model_validator(mode="after")
    def _defaults_from_other_sections(self) -> TrainConfig:
        """Defaults that depend on another section, applied only to keys the user left unset."""
        if "name" not in self.model.model_fields_set and self.data.source == "toy":
            self.model.name = "linear"  # one dense layer: the toy data comes from a linear teacher
        pretrained = self.model.name not in model_names() and Path(self.model.name).is_dir()
        if "tokenizer" not in self.data.model_fields_set and pretrained:
            # a pretrained model only understands its own token ids
            self.data.tokenizer = self.model.name
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:
        if self.strategy not in strategy_names():
            raise ValueError(
                f"unknown strategy {self.strategy!r}; choose one of {', '.join(strategy_names())}"
            )
        if self.launch.node_rank >= self.launch.node_range[1]:
            raise ValueError(
                f"launch.node_rank={self.launch.node_rank} must be < "
                f"launch.nnodes={self.launch.nnodes}"
            )
        if self.model.split_devices and (
            self.model.name != "mlp" or self.strategy not in ("single", "ddp")
        ):
            raise ValueError(
                "model.split_devices splits the toy MLP inside one process: it needs "
                f"model.name=mlp and strategy single or ddp (got model.name={self.model.name}, "
                f"strategy={self.strategy})"
            )
        if self.model.activation_checkpointing and self.model.name in TOY_MODELS:
            raise ValueError(
                "model.activation_checkpointing recomputes transformer layers: model "
                f"{self.model.name} has none (use a BERT preset or a pretrained model)"
            )
        if self.data.dev_percent + self.data.test_percent >= 90:
            raise ValueError(
                "data.dev_percent + data.test_percent must leave at least 10% for training"
            )
        return self

    def strategy_options(self) -> Options | None:
        """The strategy's own options section (``ddp``, ``deepspeed``, ...), or None for one without
        options."""
        section = lookup(self.strategy).cls.options_section
        return getattr(self, section) if section else None

    @property
    def world_size(self) -> int:
        """The job's world size (the largest, for an elastic node range)."""
        return self.world_sizes[-1]

    @property
    def world_sizes(self) -> list[int]:
        """Every world size the job can have: one, or one per node count of an elastic range."""
        low, high = self.launch.node_range
        return [self.launch.nproc_per_node * nodes for nodes in range(low, high + 1)]

    def micro_batch_size(self, world_size: int) -> int:
        """Per-rank micro-batch; raises ConfigError when the global batch does not divide evenly."""
        return micro_batch_size(self.batch_size, world_size, self.grad_accum)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def apply_override(tree: dict, dotted: str, value: Any) -> None:
    """Set ``tree[a][b] = value`` for ``dotted='a.b'``, checking every key against the schema."""
    parts = dotted.split(".")
    model: type[BaseModel] = TrainConfig
    node = tree
    for i, key in enumerate(parts):
        fields = model.model_fields
        if key not in fields:
            where = ".".join(parts[:i]) or "top level"
            hint = difflib.get_close_matches(key, list(fields), n=1)
            suggestion = f"; did you mean {'.'.join(parts[:i] + hint)!r}?" if hint else ""
            raise ConfigError(f"unknown config key {dotted!r} (no {key!r} in {where}){suggestion}")
        annotation = fields[key].annotation
        section = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
        if i == len(parts) - 1:
            if section is not None:
                raise ConfigError(
                    f"config key {dotted!r} is a section; set one of its fields, e.g. "
                    f"{dotted}.{next(iter(section.model_fields))}"
                )
            node[key] = value
        else:
            if section is None:
                raise ConfigError(f"config key {'.'.join(parts[: i + 1])!r} is not a section")
            node = node.setdefault(key, {})
            model = section


def _flatten(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    items = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            items.extend(_flatten(value, dotted + "."))
        else:
            items.append((dotted, value))
    return items


def build_config(
    config_file: str | Path | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> TrainConfig:
    """Merge file < ``--set`` overrides < explicit CLI flags and validate once."""
    tree: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            loaded = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
        for dotted, value in _flatten(loaded):
            try:
                apply_override(tree, dotted, value)
            except ConfigError as e:
                raise ConfigError(f"{path}: {e}") from None
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        apply_override(tree, key.strip(), parse_value(raw.strip()))
    for dotted, value in (flags or {}).items():
        if value is not None:
            apply_override(tree, dotted, value)
    apply_variant(tree)
    return validate(tree)


def apply_variant(tree: dict[str, Any]) -> None:
    """Set the keys a strategy variant fixes (``deepspeed-zero3``: ``deepspeed.zero_stage=3``);
    a different value given for one of them is an error naming both."""
    name = tree.get("strategy", "single")
    try:
        variant = lookup(name)
    except ValueError as e:
        raise ConfigError(f"strategy: {e}") from None
    for dotted, value in variant.settings.items():
        node = tree
        *sections, key = dotted.split(".")
        for section in sections:
            node = node.get(section, {})
        if key in node and node[key] != value:
            raise ConfigError(
                f"strategy {name!r} sets {dotted}={value!r}; it was also given {node[key]!r}"
            )
        apply_override(tree, dotted, value)


def validate(tree: dict[str, Any]) -> TrainConfig:
    try:
        return TrainConfig.model_validate(tree)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"]) or "config"
            given = (
                f" (got {err['input']!r})"
                if "input" in err and not isinstance(err["input"], dict)
                else ""
            )
            lines.append(f"  {key}: {err['msg']}{given}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None


def load_config_json(path: str | Path) -> TrainConfig:
    return validate(json.loads(Path(path).read_text(encoding="utf-8")))


def describe_fields(
    model: type[BaseModel] = TrainConfig, prefix: str = ""
) -> list[tuple[str, str, str]]:
    """(dotted key, default, docstring) for every leaf field: the config reference in ``--help``."""
    rows = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows.extend(describe_fields(annotation, f"{prefix}{name}."))
        else:
            # ignore[call-arg]: rankwise's factories take no argument (pydantic also allows one of
            # the validated data)
            default = field.default if field.default_factory is None else field.default_factory()  # type: ignore[call-arg]
            rows.append(
                (
                    f"{prefix}{name}",
                    json.dumps(default, ensure_ascii=False),
                    field.description or "",
                )
            )
    return rows
