"""`iobench search` with a real model's measured demand in place of the workload's compute
time (issue 33, item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli
from iobench.core.errors import ConfigError
from iobench.core.result_types import TrainResult
from iobench.workflows.search import SearchConfig, _setting_warnings, measured_demand
from result_docs import real_result


def _measured(dataset: str = "imagenet", rate: float = 3691.0) -> dict:
    """A real result whose model measured `rate` samples/s (as resnet50 on one H200 did)."""
    doc = real_result()
    doc["dataset"]["dataset"] = dataset
    doc["compute"].update(kind="model", model="resnet50",
                          device={"type": "cuda", "name": "NVIDIA H200"},
                          demand={"samples_per_s": rate, "ms_per_step": 128 / rate * 1e3,
                                  "batch_size": 128, "device": "cuda", "warmup": 5,
                                  "steps": 20})
    return doc


def test_a_measured_demand_sets_the_search_step() -> None:
    rate, source = measured_demand(TrainResult.of(_measured()), "resnet50")
    assert rate == 3691.0
    assert source.startswith("resnet50 (batch 128) on NVIDIA H200: 3691 samples/s")
    cfg = SearchConfig(workload="resnet50", accelerator="h100", storage="/x",
                       demand_samples_per_s=rate, demand_source=source)
    assert cfg.compute_s == pytest.approx(400 / 3691.0)  # the workload's batch at that rate
    assert cfg.demand_Bps == pytest.approx(3691.0 * 114_660)
    [warning] = _setting_warnings(cfg)
    assert warning.startswith("MEASURED DEMAND: resnet50 (batch 128) on NVIDIA H200")
    # without it, the workload's own compute time as before
    assert SearchConfig(workload="resnet50", accelerator="h100",
                        storage="/x").compute_s == pytest.approx(0.224)


def test_a_run_without_demand_or_on_another_dataset_is_refused(tmp_path: Path,
                                                                capsys) -> None:
    with pytest.raises(ConfigError, match="measured no demand"):
        measured_demand(TrainResult.of(real_result()), "resnet50")
    with pytest.raises(ConfigError, match="but resnet50 reads imagenet"):
        measured_demand(TrainResult.of(_measured("cifar10")), "resnet50")
    path = tmp_path / "emulated.json"
    path.write_text(json.dumps(real_result()))
    assert cli("search", "--workload", "resnet50", "--accelerator", "h100", "--storage",
               tmp_path, "--demand-from", path) == 2
    assert "measured no demand" in capsys.readouterr().err
