"""Which framework a script trains with, and the scripts refused before anything runs."""

from __future__ import annotations

import pytest

from rankwise.errors import ConfigError
from rankwise.tools.watch.frameworks import detect, framework


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch\nimport torch.distributed as dist\n", "torch"),
        ("from accelerate import Accelerator\n", "accelerate"),
        ("import accelerate\n", "accelerate"),
        (
            "from transformers import Trainer, TrainingArguments\ntrainer = Trainer(model=m)\n",
            "trainer",
        ),
        # a model from transformers, trained in a plain loop
        ("from transformers import AutoModel\n", "torch"),
        ("from lightning.fabric import Fabric\n", "fabric"),
        ("import lightning as L\n", "fabric"),
        ("import lightning as L\ntrainer = L.Trainer(devices=2)\n", "lightning"),
        ("from pytorch_lightning import Trainer\nTrainer(max_epochs=1).fit(m)\n", "lightning"),
        (
            "import lightning as L\nfrom transformers import "
            "AutoModel\nL.Trainer(devices=2).fit(m)\n",
            "lightning",
        ),
        ("from lightning.fabric import Fabric\nfabric = Fabric()\n", "fabric"),
        ("import rankwise\nrt = rankwise.setup()\n", "rankwise"),
        ("# accelerate is not imported here\nimport torch\n", "torch"),
        (
            "import torch.multiprocessing as mp\nmp.spawn(train, args=(2,), nprocs=2, join=True)\n",
            "spawn",
        ),
        ("import torch\ntorch.multiprocessing.spawn(train, nprocs=2)\n", "spawn"),
        (
            "from torch.multiprocessing import start_processes\nstart_processes(train, nprocs=2)\n",
            "spawn",
        ),
        (
            "import rankwise\nimport torch.multiprocessing as mp\nmp.spawn(train, nprocs=2)\n",
            "rankwise",
        ),
        (
            "import torch.multiprocessing as mp\nif __name__ == '__main__':\n"
            "    mp.spawn(train, nprocs=2)\n",
            "spawn",
        ),
        # ImageNet's main.py: mp.spawn behind --multiprocessing-distributed, main_worker else
        (
            "import torch.multiprocessing as mp\ndef main(args):\n"
            "    if args.multiprocessing_distributed:\n        mp.spawn(main_worker, nprocs=2)\n"
            "    else:\n        main_worker(args.gpu)\n",
            "torch",
        ),
        ("import deepspeed\nengine, *_ = deepspeed.initialize(model=m)\n", "deepspeed"),
        ("import horovod.torch as hvd\nhvd.init()\n", "horovod"),
        (
            "import deepspeed\nfrom accelerate import Accelerator\nx = 'deepspeed.initialize'\n",
            "accelerate",
        ),
    ],
)
def test_the_framework_comes_from_the_scripts_imports(tmp_path, source, expected):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert detect(script) == expected


def test_accelerate_starts_in_its_cpu_mode_only_without_a_gpu(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    cpu = framework("accelerate")
    assert cpu.environment["ACCELERATE_USE_CPU"] == "True" and "DDP only" in cpu.note
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    gpu = framework("accelerate")
    assert gpu.environment == {} and gpu.note is None


def test_a_deepspeed_scripts_zero_stage_is_not_a_launcher_setting_and_says_how_instead():
    with pytest.raises(ConfigError, match="one bench per file"):
        framework("deepspeed").with_strategy("deepspeed-zero3")
