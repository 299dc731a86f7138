"""The accelerator's own demand: a model's compute-only rate on one batch already on its device."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from iobench.core.errors import ConfigError
from iobench.core.models import channels_last as to_channels_last
from iobench.core.result_types import DemandInfo, Record, ResultError

# the JSON keys: DemandInfo's fields, less a record's own (its unnamed keys, absent ones)
_KEYS = frozenset(f.name for f in fields(DemandInfo)) - {f.name for f in fields(Record)}


@dataclass(frozen=True, kw_only=True)
class Demand(DemandInfo):
    """Samples per second a model trains at when its input costs nothing: `steps` timed
    steps (forward, backward, optimizer step) on one batch of `batch_size` samples resident
    on `device`, after `warmup` untimed ones; on a GPU the clock stops after
    `torch.cuda.synchronize()`. `ms_per_step` is the mean step time (milliseconds). Its
    fields and JSON are the result's `compute.demand` (`result_types.DemandInfo`, the one
    definition); a key that record does not name is refused here."""

    EXTRA: ClassVar[bool] = False

    @classmethod
    def from_dict(cls, doc: Any, where: str = "demand") -> Demand:
        unknown = set(doc) - _KEYS if isinstance(doc, dict) else set()
        if unknown:
            raise ConfigError(f"demand: unknown keys {sorted(unknown)}")
        try:
            return super().from_dict(doc, where)
        except ResultError as e:
            raise ConfigError(str(e)) from None  # it names `where`: demand


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[], object], batch_size: int, device: torch.device,
               warmup: int = 5, steps: int = 30) -> Demand:
    """Run `step()` `warmup` times, then time `steps` calls (device synchronised before the
    clock starts and before it stops)."""
    if warmup < 0 or steps < 1 or batch_size < 1:
        raise ConfigError(f"{warmup=} must be >= 0, {steps=} and {batch_size=} >= 1")
    for _ in range(warmup):
        step()
    _sync(device)
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        step()
    _sync(device)
    per_step_s = (time.perf_counter_ns() - t0) / 1e9 / steps
    return Demand(samples_per_s=batch_size / per_step_s, ms_per_step=per_step_s * 1e3,
                  batch_size=batch_size, device=str(device), warmup=warmup, steps=steps)


def compute_rate(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 x: torch.Tensor, y: torch.Tensor, *,
                 finish: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 autocast: contextlib.AbstractContextManager[Any] | None = None,
                 channels_last: bool = False, warmup: int = 5, steps: int = 30) -> Demand:
    """The compute-only rate of training `model` with `optimizer` on the batch (x, y), both
    already on the model's device, each step as `iobench train` runs it: the batch's
    `finish` (its conversion to floats) first, then forward (under `autocast`), loss,
    backward, optimizer step. Copies of the model and the optimizer take the steps: the
    caller's weights and optimizer state are left as they were. A DistributedDataParallel
    model is measured without its all-reduce: this rank's demand."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module  # this rank's compute alone, no gradient all-reduce
    m, opt = copy.deepcopy((model, optimizer))  # one copy: the optimizer keeps the copy's params
    m.train()
    ctx = autocast if autocast is not None else contextlib.nullcontext()

    def step() -> None:
        inp = finish(x) if finish is not None else (x if x.is_floating_point() else x.float())
        if channels_last:
            inp = to_channels_last(inp)
        with ctx:
            loss = loss_fn(m(inp).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return time_steps(step, int(y.shape[0]), x.device, warmup, steps)
