"""rt.loader's copy ahead on a CUDA device (``rankwise.runtime.prefetch``): the copies are made on a
side stream from pinned batches, ``rt.to_device`` takes every one of them, and they hold the batch's
values once the current stream reads them.  Skipped without CUDA (shown as skipped)."""

from __future__ import annotations

import pytest
import torch

import rankwise

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check)"),
]


def test_every_batch_is_taken_from_its_copy_made_ahead_on_a_side_stream():
    features = torch.randn(512, 1024)
    data = torch.utils.data.TensorDataset(features, torch.arange(512))
    with rankwise.setup("single", seed=0) as rt:
        loader = rt.loader(data, 32)  # prefetch: on by default on CUDA
        assert loader.ahead is not None
        seen = 0
        for host_x, host_index in loader:
            assert host_x.is_pinned() and host_x.device.type == "cpu"
            x, index = rt.to_device((host_x, host_index))
            # the side stream's copy, ordered before this stream's reads
            assert x.device.type == "cuda" and rt.prefetch._stream is not None
            torch.testing.assert_close(x.sum(1), features[index.cpu()].cuda().sum(1))
            seen += 1
        assert seen == 16 and rt.prefetch.taken == 2 * seen  # each batch's two tensors
        assert rt.prefetch.copied_again == 0
