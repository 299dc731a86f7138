"""Checkpoint layouts: the tensors each rank saves, for MLPerf Storage's llama3 sizes or a model `train` knows.

A layout gives every rank the same list of 1-D tensors (name, dtype, elements), the way
FSDP / ZeRO-3 hold a model: each rank a slice of every parameter, with its optimizer state
beside it. The llama3 layouts take the tensor list from the model's architecture and the
size from MLPerf Storage's checkpoint table (total bytes over its process count), so a rank
saves `total / processes * scale` bytes in the architecture's mix of tensor sizes; `scale`
shrinks every tensor alike (never below one element), so the tensor count per rank and the
mix stay. A real model (`iobench.core.models.MODELS`) saves its state dict and one SGD
momentum buffer per parameter, sliced across the ranks the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from iobench.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

GB = 1_000_000_000
TB = 1_000 * GB
# mixed-precision Adam, as DLIO and MLPerf Storage count a checkpoint: a bf16 weight, and an
# fp32 master copy, first and second moment per parameter (2 + 4 + 4 + 4 bytes)
ADAM_STATE: tuple[tuple[str, str], ...] = (("weight", "bfloat16"), ("master", "float32"),
                                           ("exp_avg", "float32"), ("exp_avg_sq", "float32"))
ITEM_BYTES = {"bfloat16": 2, "float32": 4}
BYTES_PER_PARAM = sum(ITEM_BYTES[d] for _, d in ADAM_STATE)


@dataclass(frozen=True)
class Llama3:
    """A llama3 model: its architecture (the tensor mix) and MLPerf Storage's checkpoint
    (`processes` ranks writing `total_bytes` in all)."""

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    processes: int
    total_bytes: int

    def tensors(self) -> list[tuple[str, int]]:
        """(name, parameters) of every tensor of the model, in order."""
        h, kv = self.hidden, self.hidden * self.kv_heads // self.heads
        out = [("tok_embeddings", self.vocab * h)]
        for i in range(self.layers):
            out += [(f"layers.{i}.attention.wq", h * h), (f"layers.{i}.attention.wk", h * kv),
                    (f"layers.{i}.attention.wv", h * kv), (f"layers.{i}.attention.wo", h * h),
                    (f"layers.{i}.feed_forward.w1", h * self.ffn),
                    (f"layers.{i}.feed_forward.w2", self.ffn * h),
                    (f"layers.{i}.feed_forward.w3", h * self.ffn),
                    (f"layers.{i}.attention_norm", h), (f"layers.{i}.ffn_norm", h)]
        return out + [("norm", h), ("output", self.vocab * h)]

    @property
    def parameters(self) -> int:
        return sum(n for _, n in self.tensors())


# MLPerf Storage v2.0/v3.0 checkpointing sizes; architectures from Meta's llama3 releases
# (1t: no published model; its mix is an assumption, its size MLPerf's)
LLAMA3: dict[str, Llama3] = {m.name: m for m in (
    Llama3("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8, 105 * GB),
    Llama3("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 64, 912 * GB),
    Llama3("llama3-405b", 126, 16384, 53248, 128, 8, 128256, 512, 5290 * GB),
    Llama3("llama3-1t", 128, 25600, 102400, 160, 16, 128256, 1024, 18 * TB),
)}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor a rank saves: its name (without the rank prefix), dtype and elements."""

    name: str
    dtype: str  # "bfloat16" or "float32"
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * ITEM_BYTES[self.dtype]


@dataclass(frozen=True)
class Layout:
    """What each rank of a checkpoint saves: `model` at `scale`, over `ranks` ranks."""

    model: str
    scale: float
    ranks: int
    kind: str  # "llama3" or "model"
    tensors: tuple[TensorSpec, ...]  # one rank's (rank 0's: the last ranks may hold less)
    processes: int | None  # the process count MLPerf Storage runs the model with
    about: str

    @property
    def rank_bytes(self) -> int:
        """Tensor bytes one rank saves (the first rank's; a slice may be shorter at the end)."""
        return sum(t.nbytes for t in self.tensors)


def parse_scale(scale: float) -> float:
    """`scale` when it is a number > 0 (at most 1: a checkpoint larger than MLPerf's is not
    its layout); else a ConfigError."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0 \
            or scale > 1:
        raise ConfigError(f"--scale {scale!r} must be a fraction in (0, 1]: each rank then "
                          "saves that share of the model's per-rank bytes (e.g. 0.001 for "
                          "13 MB per rank of llama3-8b)")
    return float(scale)


def model_names() -> list[str]:
    """Every model a checkpoint can take its layout from: llama3 sizes, then `train`'s."""
    from iobench.core.models import MODELS

    return [*LLAMA3, *MODELS]


def layout_for(model: str, scale: float, ranks: int) -> Layout:
    """The layout of `model` (a llama3 size or a model `train` knows) for `ranks` ranks."""
    scale = parse_scale(scale)
    if model in LLAMA3:
        return _llama3_layout(LLAMA3[model], scale, ranks)
    from iobench.core.models import MODELS

    if model not in MODELS:
        raise ConfigError(f"unknown model {model!r}; choose one of: {', '.join(model_names())}")
    if scale != 1.0:
        raise ConfigError(f"--scale applies to the llama3 layouts; {model} is saved whole "
                          "(its real state dict): drop --scale")
    return _model_layout(model, ranks)


def _llama3_layout(m: Llama3, scale: float, ranks: int) -> Layout:
    """Per rank: total / processes * scale bytes, in the architecture's tensor mix."""
    budget = m.total_bytes / m.processes * scale
    per_param = budget / m.parameters / BYTES_PER_PARAM  # elements per parameter of the model
    specs = []
    for name, n in m.tensors():
        numel = max(1, round(n * per_param))
        specs += [TensorSpec(f"{name}.{part}", dtype, numel) for part, dtype in ADAM_STATE]
    return Layout(model=m.name, scale=scale, ranks=ranks, kind="llama3", tensors=tuple(specs),
                  processes=m.processes,
                  about=f"{m.name}: {m.parameters / 1e9:.1f} B parameters, MLPerf Storage's "
                        f"{m.total_bytes / GB:,.0f} GB over {m.processes} processes; "
                        f"{len(specs)} tensors per rank (FSDP-style slices with Adam state)")


def _model_layout(model: str, ranks: int) -> Layout:
    """Per rank: a 1/ranks slice of every state-dict tensor and SGD momentum buffer."""
    net = _build(model)
    specs = []
    for name, t in net.state_dict().items():
        if t.is_floating_point():
            specs.append(TensorSpec(f"model.{name}", "float32", _slice_len(t.numel(), ranks)))
    for name, p in net.named_parameters():
        specs.append(TensorSpec(f"optim.{name}.momentum_buffer", "float32",
                                _slice_len(p.numel(), ranks)))
    return Layout(model=model, scale=1.0, ranks=ranks, kind="model", tensors=tuple(specs),
                  processes=None,
                  about=f"{model}: model state dict and SGD momentum, sliced over "
                        f"{ranks} rank(s); {len(specs)} tensors per rank")


def _slice_len(numel: int, ranks: int) -> int:
    """Elements of rank 0's slice of a tensor split over `ranks` (at least one)."""
    return max(1, -(-numel // ranks))


def _build(model: str) -> torch.nn.Module:
    from iobench.core.datasets import DATASETS
    from iobench.core.models import MODELS, build_model

    spec = MODELS[model]
    outputs = DATASETS[spec.datasets[0]].num_classes or 4  # regression: 4 targets
    return build_model(model, outputs)


def build_state(layout: Layout, rank: int, seed: int) -> dict[str, torch.Tensor]:
    """This rank's state dict: the layout's tensors under `rank<R>/`, filled with seeded
    random bits (for a real model: its initial weights; random momentum), so that no
    compressing or deduplicating storage writes less than the checkpoint holds."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    real = _real_values(layout, rank, seed) if layout.kind == "model" else {}
    state = {}
    for t in layout.tensors:
        x = torch.empty(t.numel, dtype=getattr(torch, t.dtype))
        src = real.get(t.name)
        if src is not None:
            x.copy_(src)
        else:  # random bits, not random numbers: ~10x faster, and the I/O is the same
            x.view(torch.int16 if t.dtype == "bfloat16" else torch.int32).random_(generator=gen)
        state[f"rank{rank}/{t.name}"] = x
    return state


def _real_values(layout: Layout, rank: int, seed: int) -> dict[str, torch.Tensor]:
    """The model's initial weights (seeded), this rank's slice of each, padded to length."""
    import torch

    with torch.random.fork_rng(devices=[]):  # seeded here, never the process's generator
        torch.manual_seed(seed)
        net = _build(layout.model)
    out = {}
    for name, t in net.state_dict().items():
        if not t.is_floating_point():
            continue
        n = _slice_len(t.numel(), layout.ranks)
        flat = t.detach().reshape(-1).float()[rank * n:(rank + 1) * n]
        out[f"model.{name}"] = torch.nn.functional.pad(flat, (0, n - flat.numel()))
    return out


def empty_state(layout: Layout, rank: int) -> dict[str, torch.Tensor]:
    """Zeroed tensors of this rank's state dict, for a read of a checkpoint written before."""
    import torch

    return {f"rank{rank}/{t.name}": torch.zeros(t.numel, dtype=getattr(torch, t.dtype))
            for t in layout.tensors}
