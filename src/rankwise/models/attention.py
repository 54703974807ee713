"""The attention backend the built-in app's models run on."""

from __future__ import annotations

import torch


def attention_for_varying_lengths(device: torch.device) -> None:
    """Turn off the cuDNN backend of ``scaled_dot_product_attention`` on CUDA.

    Batches are padded to their own longest text, so nearly every step has a new sequence length,
    and torch's cuDNN attention builds a new execution plan for each one.  Measured on an H100
    (torch 2.11, CUDA 13, base BERT, bf16, batch 128): a step on a new length took 0.17-2.3 s,
    median 184 ms, against 39 ms with that backend off (43 ms with it on lengths already seen);
    `rankwise train` (60 steps) ran at 555 steady samples/s with it, 2,657 without.  Flash and
    memory-efficient attention take over, with no per-shape cost.  Process-wide, in the training app
    only: the library (``rankwise.setup``) leaves the user's backends alone.
    """
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
