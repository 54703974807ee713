import os

import pytest
import torch.distributed as torch_dist

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@pytest.fixture(autouse=True)
def clean_distributed_state():
    """Restore environment variables and destroy any process group a test left behind."""
    saved = {k: os.environ.get(k) for k in (*_DIST_VARS, "OMP_NUM_THREADS")}
    yield
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
