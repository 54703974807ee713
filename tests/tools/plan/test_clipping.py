"""Clipping read from a script's text: the calls and settings users write, and what is not one."""

import pytest

from rankwise.tools.plan.clipping import clipping_line

CLIPS = [
    "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)",
    "fabric.clip_gradients(model, optimizer, max_norm=2.0)",
    "fabric.clip_gradients(model, optimizer, None, 2.0)",
    "norm = rt.step(optimizer, model, max_norm=1.0)",
    "trainer = L.Trainer(max_epochs=1, gradient_clip_val=0.5)",
    "TrainingArguments(output_dir='out', max_grad_norm=args.clip)",
    "config = {'train_batch_size': 16, 'gradient_clipping': 1.0}",
]
NOT = [
    "rt.step(optimizer, model)",
    "rt.step(optimizer, model, max_norm=None)",
    "trainer = L.Trainer(gradient_clip_val=None)",
    "config = {'gradient_clipping': 0.0}",
    "# torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    # Fabric's language-model example (the zoo): clip_val clips each value, no norm is reduced
    "fabric.clip_gradients(model, optimizer, clip_val=0.25)",
]


@pytest.mark.parametrize("line", CLIPS)
def test_a_clipping_call_or_setting_is_found_at_its_line(tmp_path, line):
    script = tmp_path / "train.py"
    script.write_text(f"import torch\n\n{line}\n", encoding="utf-8")
    assert clipping_line(script) == 3


@pytest.mark.parametrize("line", NOT)
def test_no_clipping_is_found_where_none_is_set(tmp_path, line):
    script = tmp_path / "train.py"
    script.write_text(f"import torch\n{line}\n", encoding="utf-8")
    assert clipping_line(script) is None


def test_an_unreadable_script_is_left_to_the_capture_to_report(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("def (\n", encoding="utf-8")
    assert clipping_line(script) is None
    assert clipping_line(tmp_path / "missing.py") is None
