"""The accelerator's own demand (`iobench.core.demand`): a model's compute-only rate on a resident batch."""

from __future__ import annotations

import pytest
import torch

from iobench.core.demand import Demand, compute_rate, time_steps
from iobench.core.errors import ConfigError
from iobench.core.models import build_model


def test_the_cnns_compute_rate_leaves_the_callers_model_as_it_was():
    torch.manual_seed(0)
    model = build_model("cnn", 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    y = torch.randint(0, 10, (16,))
    calls = []

    def finish(t: torch.Tensor) -> torch.Tensor:
        calls.append(t.shape)
        return t.float() / 255

    d = compute_rate(model, opt, torch.nn.CrossEntropyLoss(), x, y, finish=finish,
                     warmup=2, steps=3)
    assert (d.batch_size, d.device, d.warmup, d.steps) == (16, "cpu", 2, 3)
    assert d.samples_per_s > 0 and d.ms_per_step > 0
    assert abs(d.samples_per_s * d.ms_per_step / 1e3 - 16) < 1e-6  # one step moves a batch
    assert len(calls) == 5  # the conversion is part of every step
    for k, v in model.state_dict().items():  # the copies trained, not the caller's model
        assert torch.equal(v, before[k]), k
    assert not opt.state  # nor its optimizer
    assert Demand.from_dict(d.to_dict()) == d


def test_time_steps_counts_and_refuses_nonsense():
    n = []
    d = time_steps(lambda: n.append(1), 8, torch.device("cpu"), warmup=1, steps=4)
    assert len(n) == 5 and d.steps == 4
    with pytest.raises(ConfigError, match="steps=0"):
        time_steps(lambda: None, 8, torch.device("cpu"), steps=0)
    with pytest.raises(ConfigError, match="unknown keys"):
        Demand.from_dict({**d.to_dict(), "extra": 1})


@pytest.mark.parametrize(("name", "shape", "outputs"), [
    ("cosmoflow", (2, 4, 32, 32, 32), 4), ("resnet50", (2, 3, 64, 64), 1000)])
def test_channels_last_fits_3d_and_2d_models(name, shape, outputs):
    """`--channels-last` on cosmoflow's 3-D convolutions (once an internal error: 'required
    rank 4 tensor to use channels_last format') and on a 2-D model, in train's own helpers."""
    from iobench.core.models import channels_last, channels_last_model

    model = channels_last_model(build_model(name, outputs))
    fmt = torch.channels_last_3d if len(shape) == 5 else torch.channels_last
    x = channels_last(torch.randn(*shape))
    assert x.is_contiguous(memory_format=fmt)
    assert next(p for p in model.parameters() if p.dim() == len(shape)).is_contiguous(
        memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = torch.nn.MSELoss() if name == "cosmoflow" else torch.nn.CrossEntropyLoss()
    y = torch.randn(2, outputs) if name == "cosmoflow" else torch.randint(0, outputs, (2,))
    d = compute_rate(model, opt, loss, x, y, channels_last=True, warmup=1, steps=1)
    assert d.samples_per_s > 0
