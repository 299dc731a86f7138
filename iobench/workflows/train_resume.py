"""`train --resume`: the newest complete training checkpoint found, checked against the run, loaded through DCP's tensor-only path.

Each training checkpoint holds, beside DCP's files and the completion marker, a small
versioned JSON (`iobench-train-state.json`, written atomically by rank 0 before the
commit, so named with its size in the marker): where the save was taken (epoch, steps of
that epoch, steps of the training run) and what the step counts mean (model, dataset,
ranks, batch size). A resumed run takes the newest checkpoint under
`--checkpoint-to DIR/iobench-train-*/` that `check_marker` accepts (a `.partial` folder a
killed or failed save left has no marker: never a candidate), refuses one of another model,
dataset, world size or batch size in one line, and loads the model's state dict and the
optimizer's momentum with DCP, without unpickling anything (`checkpoint_store.reader`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from iobench.core.checkpoint_store import (
    MARKER,
    CheckpointRefused,
    check_marker,
    check_tensors,
    load_metadata,
    reader,
)
from iobench.core.errors import ConfigError, IobenchError
from iobench.core.jsonio import read_json, write_json_atomic
from iobench.core.schema import Count, Map, Str, check

STATE = "iobench-train-state.json"
STATE_SCHEMA = "iobench.train_state"
STATE_VERSION = 1
RUN_GLOB = "iobench-train-*"


@dataclass(frozen=True)
class TrainState:
    """Where a training checkpoint was taken, and what its step counts mean."""

    model: str
    dataset: str
    ranks: int
    batch_size: int
    seed: int
    epoch: int  # the epoch the save was taken in (0-based)
    epoch_step: int  # steps of that epoch done
    step: int  # steps of the training run done (across its epochs and the runs it resumed)
    run_id: str  # the run that saved it
    saved_ns: int  # wall clock (ns): the newest checkpoint is resumed

    def to_dict(self) -> dict[str, Any]:
        return {"schema": STATE_SCHEMA, "schema_version": STATE_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any], where: str) -> TrainState:
        check(doc, _STATE_SPEC, where)
        return cls(**{k: doc[k] for k in _FIELDS})


_FIELDS = ("model", "dataset", "ranks", "batch_size", "seed", "epoch", "epoch_step", "step",
           "run_id", "saved_ns")
_STATE_SPEC = Map({"schema": Str, "schema_version": Count, "model": Str, "dataset": Str,
                   "ranks": Count, "batch_size": Count, "seed": Count, "epoch": Count,
                   "epoch_step": Count, "step": Count, "run_id": Str, "saved_ns": Count},
                  extra=False)


def write_state(folder: Path, state: TrainState) -> None:
    """Rank 0, into a checkpoint's `.partial` folder before its commit (atomic, fsync'ed)."""
    write_json_atomic(folder / STATE, state.to_dict())


def read_state(path: Path) -> TrainState:
    """The training state of the complete checkpoint at `path` (its marker checked: every
    file, the state among them, whole); CheckpointRefused in one line otherwise."""
    marker = check_marker(path)
    if STATE not in marker.files:
        raise CheckpointRefused(f"{path} holds no training state ({STATE}): not a checkpoint "
                                "`iobench train` saved (or saved before --resume existed)")
    try:
        doc = read_json(path / STATE, schema=STATE_SCHEMA, max_version=STATE_VERSION)
        return TrainState.from_dict(doc, str(path / STATE))
    except IobenchError as e:
        raise CheckpointRefused(f"{path / STATE}: {e}") from None


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run resumes from, and the newer-looking ones it passed over (why)."""

    path: Path
    state: TrainState
    skipped: tuple[str, ...] = ()


def newest_complete(folder: Path) -> ResumePoint:
    """The newest complete training checkpoint under `folder/iobench-train-*/` (by the time
    it was saved); a ConfigError in one line when there is none."""
    found: list[tuple[Path, TrainState]] = []
    skipped: list[str] = []
    for p in sorted(folder.glob(f"{RUN_GLOB}/ckpt-*")):
        if not (p / MARKER).is_file():
            continue  # never committed (a `.partial` folder is not even named ckpt-*)
        try:
            found.append((p, read_state(p)))
        except IobenchError as e:
            skipped.append(f"{p} not resumed: {e}")
    if not found:
        raise ConfigError(f"--resume: no complete training checkpoint in {folder}/{RUN_GLOB}/ "
                          "(a killed or failed save leaves none)"
                          + (f"; {len(skipped)} refused, the first: {skipped[0]}" if skipped
                             else "")
                          + ": drop --resume to train from the start")
    path, state = max(found, key=lambda f: (f[1].saved_ns, f[0].parent.name, f[0].name))
    return ResumePoint(path, state, tuple(skipped))  # refused ones cannot be dated: each said


def check_against_run(point: ResumePoint, model: str, dataset: str, ranks: int,
                      batch_size: int) -> None:
    """ConfigError in one line when the checkpoint's steps mean something else in this run:
    another model or dataset (other tensors), world size or batch size (other samples per
    step, another split of each epoch among the ranks)."""
    s, where = point.state, point.path
    for what, theirs, ours, fix in (
            ("model", s.model, model, f"--model {s.model}"),
            ("dataset", s.dataset, dataset, f"--dataset {s.dataset}"),
            ("world size", s.ranks, ranks, f"{s.ranks} rank(s) (mpiexec -n {s.ranks})"),
            ("batch size", s.batch_size, batch_size, f"--batch-size {s.batch_size}")):
        if theirs != ours:
            raise ConfigError(f"--resume: {where} was saved with {what} {theirs}, this run has "
                              f"{ours}: run with {fix}, or give --checkpoint-to a folder "
                              "without it to train from the start")


def model_state(model: Any, opt: Any) -> dict[str, Any]:
    """What a training checkpoint holds, tensors only (no pickled objects to unpickle at a
    read): the model's state dict (`model.<name>`, the DDP wrapper's inner module) and the
    optimizer's per-parameter state (`optim.<name>.<buffer>`, SGD's momentum)."""
    import torch

    net = getattr(model, "module", model)
    out: dict[str, Any] = {f"model.{k}": v for k, v in net.state_dict().items()}
    for name, p in net.named_parameters():
        for k, v in opt.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                out[f"optim.{name}.{k}"] = v
    return out


def load_into(path: Path, model: Any, opt: Any, pg: Any, no_dist: bool) -> int:
    """Load the checkpoint at `path` into `model` (its DDP wrapper's inner module) and
    `opt` (SGD's momentum buffers made for the parameters it holds them for) with DCP,
    through the checkpoint store's checks (marker, metadata unpickled by an allow-list,
    every tensor's shape and dtype): into CPU tensors, then copied in place. Bytes loaded."""
    import torch
    from torch.distributed.checkpoint.state_dict_loader import load

    check_marker(path)
    md = load_metadata(path)
    held = dict(getattr(md, "state_dict_metadata", {}) or {})
    net = getattr(model, "module", model)
    params = dict(net.named_parameters())
    for key in held:
        if key.startswith("optim."):
            name, buf = key.removeprefix("optim.").rsplit(".", 1)
            if name not in params:
                raise CheckpointRefused(f"--resume: {path} holds {key}, for a parameter this "
                                        "run's model does not have")
            opt.state[params[name]][buf] = torch.zeros_like(params[name])
    live = model_state(model, opt)
    extra = sorted(set(held) - set(live))
    if extra:
        raise CheckpointRefused(f"--resume: {path} holds {extra[0]}, which this run's model "
                                "does not: a checkpoint of another model")
    check_tensors(md, live, path)
    cpu = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in live.items()}
    load(cpu, storage_reader=reader(path, md), process_group=pg, no_dist=no_dist)
    with torch.no_grad():
        for k, v in live.items():
            v.copy_(cpu[k])
    return sum(t.numel() * t.element_size() for t in cpu.values())


def record(point: ResumePoint, load_s: float, nbytes: int) -> dict[str, Any]:
    """The result's `checkpoint.resumed` (docs/checkpoint.md, "Resuming")."""
    s = point.state
    return {"path": str(point.path), "run_id": s.run_id, "epoch": s.epoch,
            "epoch_step": s.epoch_step, "step": s.step, "load_s": load_s, "bytes": nbytes,
            "skipped": list(point.skipped)}
