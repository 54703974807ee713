"""pytorch#150915: ``Module.compile`` leaves a module whose ``forward`` is torch's own code
eager."""

import torch
from torch import nn

from rankwise.compat.torch_compile import COMPILE_THROUGH_A_TRACED_FRAME, compile_forward


def _graphs(compile_model) -> int:
    """How many graphs Dynamo hands its backend when a compiled ``nn.Sequential`` runs once."""
    torch._dynamo.reset()
    captured = []

    def backend(graph, example_inputs):
        captured.append(graph)
        return graph.forward

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compile_model(model, backend)
    model(torch.randn(2, 4))
    return len(captured)


def test_module_compile_still_runs_a_torch_forward_eagerly():
    """When this fails, torch compiles nn.Sequential through Module.compile: drop compile_forward's
    workaround."""
    assert _graphs(lambda model, backend: model.compile(backend=backend)) == 0
    assert COMPILE_THROUGH_A_TRACED_FRAME.applies()


def test_compiling_the_bound_forward_traces_it():
    assert _graphs(lambda model, backend: compile_forward(model, backend=backend)) == 1
