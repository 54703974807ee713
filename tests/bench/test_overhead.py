"""The overhead benchmark's two loops run on real ranks with the default model and report throughput."""

import json

from rankwise.bench.overhead import handwritten_worker, rankwise_worker
from rankwise.config import DataConfig
from rankwise.data.prepare import prepare_data
from tests.multiproc import run_ranks


def test_both_loops_train_the_default_model_and_report_throughput(tmp_path):
    data_dir = tmp_path / "data"
    # The default data settings (WordPiece tokens and character n-grams), on a slice.
    prepare_data(DataConfig(source="sentiment", max_length=32, limit=301)).save(data_dir)
    for worker in (rankwise_worker, handwritten_worker):
        run_dir = tmp_path / worker.__name__
        run_dir.mkdir()
        run_ranks(_on_rank, 2, worker, str(data_dir), str(run_dir), timeout=120)
        throughput = json.loads((run_dir / "throughput.json").read_text())["samples_per_s"]
        assert throughput > 0, worker.__name__


def _on_rank(worker, data_dir: str, run_dir: str) -> None:
    import os

    worker(int(os.environ["LOCAL_RANK"]), data_dir, run_dir, 3, 8)  # 3 steps, global batch 8
