"""The training loop takes batches in their compact form and converts them on its device
(the batch's Finish, inside the step), and `train` picks a batch size that fits the dataset."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import cli
from iobench.core.manifest import FileEntry, Manifest
from iobench.core.world import World
from iobench.loaders.base import Batch, Finish, Loader
from iobench.workflows.train import TrainConfig, run


class CompactLoader(Loader):
    """Delivers int16 [B, 32, 32, 32, 4] (DHWC, as stored) with the log1p Finish."""

    name = "hdf5"

    def epoch(self, epoch: int) -> Iterator[Batch]:
        rng = np.random.default_rng(epoch)
        idx = self.indices(epoch)
        for s in range(0, len(idx), self.config.batch_size):
            sel = idx[s:s + self.config.batch_size]
            x = rng.integers(0, 60, (len(sel), 32, 32, 32, 4), dtype=np.int16)
            y = rng.random((len(sel), 4), dtype=np.float32)
            yield Batch(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(sel),
                        x.nbytes, None, Finish("log1p", channels_last=True))


def _manifest(root: Path, n: int = 8) -> None:
    root.mkdir(parents=True)
    (root / "data.bin").write_bytes(b"\0")
    Manifest(dataset="cosmoflow", format="hdf5", num_samples=n, num_classes=0,
             sample={"kind": "array", "shape": [32, 32, 32, 4], "dtype": "int16"},
             label={"shape": [4], "dtype": "float32"}, layout={},
             files=(FileEntry("data.bin", 1, "0" * 64, 0, n, "data"),), seed=0,
             iobench_version="test", created="2026-01-01T00:00:00Z").write(root)


def test_the_step_converts_compact_batches_on_its_device(tmp_path: Path) -> None:
    """A real model trains on int16 channels-last batches: the step applies their Finish
    (log1p, channels first) before the forward pass (without it the 3D CNN sees 32 channels
    where it expects 4, and fails)."""
    _manifest(tmp_path / "cosmoflow-hdf5")
    doc = run(TrainConfig(loader="hdf5", storage=str(tmp_path), dataset="cosmoflow", epochs=1,
                          batch_size=4, workers=0, results=str(tmp_path / "res")),
              lambda m, c, r, w: CompactLoader(m, c, r, w), World())
    assert doc["compute"]["model"] == "cosmoflow"
    assert np.isfinite(doc["epochs"][0]["training"]["loss"])


def test_model_input_equals_the_loader_side_conversion() -> None:
    x = torch.from_numpy(np.arange(-8, 4088, dtype=np.int16).reshape(2, 4, 4, 32, 4).copy())
    b = Batch(x, torch.zeros(2), torch.arange(2), x.numel() * 2, None,
              Finish("log1p", channels_last=True))
    with np.errstate(divide="ignore", invalid="ignore"):  # -inf and nan included
        ref = np.log1p(x.numpy().astype(np.float32)).transpose(0, 4, 1, 2, 3)
    got = b.model_input()
    assert got.shape == (2, 4, 4, 4, 32)
    np.testing.assert_array_equal(got.numpy(), ref)


def test_cosmoflow_default_batch_fits_and_few_steps_warn(tmp_path: Path) -> None:
    """Without --batch-size, cosmoflow reads 1 sample per step (not 64: one 1 GB step per
    epoch on its default dataset); an epoch of fewer than 10 steps is flagged."""
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    generate_dataset(GenerateConfig(dataset="cosmoflow", format="hdf5", storage=tmp_path,
                                    samples=4, samples_per_file=2, seed=0))
    res = tmp_path / "res"
    assert cli("train", "--loader", "hdf5", "--dataset", "cosmoflow", "--model", "none",
               "--storage", tmp_path, "--epochs", "1", "--workers", "0", "--warm-cache",
               "--results", res) == 0
    doc = json.loads(next(res.glob("*.json")).read_text())
    assert doc["config"]["batch_size"] == 1
    assert doc["epochs"][0]["ranks"][0]["steps"] == 4
    assert any("4 step(s) per rank" in w for w in doc["warnings"]), doc["warnings"]


def test_more_ranks_on_a_node_than_gpus_is_one_agreed_line(monkeypatch):
    """Two ranks on a one-GPU node once both took `cuda:{local rank}` (cuda:1 does not exist);
    now every rank refuses together, naming the launcher options."""
    from iobench.core.errors import ConfigError
    from iobench.workflows.train import rank_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="2 ranks per node but this node has 1 GPU") as e:
        rank_device(World(rank=1, size=2, local_rank=1, local_size=2))
    assert e.value.agreed and "--nproc-per-node 1" in str(e.value)
    assert rank_device(World()) == torch.device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rank_device(World(rank=1, size=2, local_rank=1, local_size=2)).type == "cpu"
