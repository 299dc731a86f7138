"""Verdicts that fit the hardware: DALI's cause from its measured ceilings, GPU decoding
advice with its figures, a model on the CPU that measures the CPU, and the setting that
would change an answer (issues 28 and 33)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from test_verdict import _doc, one_pass

from conftest import cli
from iobench.core import results
from iobench.workflows.verdict import for_run, rate_words, verdict


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("vh-data")
    assert cli("generate", "--dataset", "cifar10", "--format", "hdf5", "--samples", "512",
               "--storage", s) == 0
    assert cli("generate", "--dataset", "imagenet", "--format", "files", "--samples", "96",
               "--storage", s) == 0
    return s


def _only(where: Path) -> results.TrainResult:
    [path] = results.find_results([where])
    return results.load_typed(path)


@pytest.mark.dali
@pytest.mark.parametrize("dataset,fmt", [("cifar10", "hdf5"), ("imagenet", "files")])
def test_a_dali_run_names_its_cause_from_measured_ceilings(data: Path, tmp_path: Path,
                                                           dataset: str, fmt: str) -> None:
    """Once 'starved (cause unknown)': DALI keeps no per-batch clocks, so train measures its
    ceilings (cold without decoding, in memory without and with) and the verdict reads them."""
    pytest.importorskip("nvidia.dali")
    assert cli("train", "--loader", "dali", "--format", fmt, "--dataset", dataset,
               "--storage", data, "--compute-time", "0.002", "--epochs", "2",
               "--batch-size", "16", "--workers", "2", "--au-threshold", "1",
               "--results", tmp_path) == 0
    doc = _only(tmp_path)
    c = doc.ceilings
    assert c is not None and c.device == "cpu" and c.threads == 2 and c.batches >= 2
    assert min(c.cold_fetch_samples_per_s, c.warm_fetch_samples_per_s,
               c.warm_decode_samples_per_s) > 0
    v = doc.summary.verdict
    assert v is not None and v.status == "starved"
    assert v.bottleneck in ("storage", "cpu", "loader", "startup"), v.line
    assert "cause unknown" not in v.line
    assert "DALI keeps no per-batch clocks, so iobench measured its ceilings" in v.line
    assert f"{rate_words(c.warm_decode_samples_per_s)} in memory decoding" in v.line


def _ceilings(doc: dict, cold: float, warm: float, decode: float,
              device: str = "cpu") -> dict:
    doc["config"]["loader"] = "dali"
    doc["epochs"][0]["ranks"][0]["loader"] = None  # DALI's pipeline keeps no clocks of ours
    doc["epochs"][0]["summary"].update(first_batch_s_max=0.1, stall_s_max=1.0)
    doc["ceilings"] = {"batches": 16, "threads": 2, "device": device, "cold": True,
                       "cold_fetch_samples_per_s": cold, "cold_fetch_MBps": cold * 0.003,
                       "warm_fetch_samples_per_s": warm,
                       "warm_decode_samples_per_s": decode}
    return doc


def _on_a_gpu_node(doc: dict) -> dict:
    doc["compute"]["device"] = {"type": "cuda", "name": "NVIDIA H200"}
    doc["provenance"]["gpus"] = [{"name": "NVIDIA H200"}]
    doc["provenance"]["versions"]["nvidia-dali"] = "2.4.0"
    return doc


def test_the_ceilings_name_each_cause() -> None:
    assert verdict(_ceilings(_doc(0.5), 900, 20_000, 15_000))["bottleneck"] == "storage"
    cpu = verdict(_ceilings(_doc(0.5), 20_000, 20_000, 3_000))
    assert cpu["bottleneck"] == "cpu" and "1,500 samples/s per thread" in cpu["line"]
    assert verdict(_ceilings(_doc(0.5), 20_000, 20_000, 3_000, "gpu"))["bottleneck"] == "decode"
    assert verdict(_ceilings(_doc(0.5), 18_000, 20_000, 19_000))["bottleneck"] == "loader"
    # most of the stall in the first batch: the pipeline's start, whatever the ceilings
    doc = _ceilings(_doc(0.5), 900, 20_000, 15_000)
    doc["epochs"][0]["summary"].update(first_batch_s_max=0.8, stall_s_max=1.0)
    assert verdict(doc)["bottleneck"] == "startup"


def test_cpu_decoding_on_a_gpu_node_says_what_the_gpu_would_do(tmp_path: Path) -> None:
    """The decode rate per core, the cores available, and DALI's GPU rate when measured."""
    doc = _on_a_gpu_node(_doc(0.5, read_s=2.0, decode_s=16.0))
    samples = sum(r["samples"] for r in doc["epochs"][0]["ranks"])
    per_core = samples / 16.0
    v = verdict(doc)
    assert v["bottleneck"] == "cpu"
    [gpu] = [a for a in v["advice"] if "this node has a GPU with DALI" in a]
    assert f"a core decodes {rate_words(per_core)} samples/s" in gpu
    assert f"the 16 core(s) available reach at most {rate_words(per_core * 16)}" in gpu
    assert "DALI's GPU rate here is not measured yet" in gpu and "--loader dali" in gpu
    # a DALI run on this node's GPU, in the same results directory, gives the GPU rate
    other = _on_a_gpu_node(_ceilings(_doc(0.95), 30_000, 31_000, 9_500, "gpu"))
    other["run_id"] = doc["run_id"][:-6] + "abcdef"
    results.write_result(other, tmp_path)
    v = for_run(doc, str(tmp_path), 0.9)
    assert "DALI decoded 9,500 samples/s on this node's GPU" in v["line"]
    # a CPU DALI pipeline's own ceiling, per thread, on a GPU node
    dali = verdict(_on_a_gpu_node(_ceilings(_doc(0.5), 20_000, 20_000, 3_000)))
    assert "a core decodes 1,500 samples/s" in dali["line"]
    # no GPU: no such sentence
    assert "GPU with DALI" not in verdict(_doc(0.5, read_s=2.0, decode_s=16.0))["line"]


def test_a_model_on_the_cpu_measures_the_cpu_not_the_storage(data: Path,
                                                              tmp_path: Path) -> None:
    """A real model trained on a node without an accelerator gets no storage verdict: it
    says what it measured and the command that asks the storage question (which runs)."""
    assert cli("train", "--loader", "hdf5", "--storage", data, "--model", "cnn",
               "--epochs", "1", "--max-steps", "4", "--batch-size", "32",
               "--results", tmp_path / "cpu") == 0
    v = _only(tmp_path / "cpu").summary.verdict
    assert v is not None and v.status == "no accelerator", v.line
    assert v.line.startswith("verdict: no accelerator - the model ran on the CPU at ")
    assert "samples/s: this measures the CPU, not the storage" in v.line
    assert "starved" not in v.line and "keeps up" not in v.line
    [advice] = v.advice
    command = advice.split("`")[1]
    assert command.startswith("iobench train --loader hdf5 --storage ")
    assert f"--compute-time {3.46e-3 / 64 * 32:.3g}" in command  # the CNN's step on an H200
    args = shlex.split(command)[2:] + ["--max-steps", "4", "--results", str(tmp_path / "gpu")]
    args[args.index("--epochs") + 1] = "1"
    assert cli("train", *args) == 0
    emulated = _only(tmp_path / "gpu").summary.verdict
    assert emulated is not None and emulated.status in ("keeps up", "starved")
    assert "measures the CPU" not in emulated.line


def test_the_verdict_says_which_setting_would_change_it() -> None:
    """Loader-bound with cores free, or storage read with few workers: one sentence names
    --workers and the diagnosis, with the run's own arguments, that settles it."""
    from iobench.cli import build_parser
    from iobench.cli import diagnose as diagnose_cli

    loader = verdict(_doc(0.6, read_s=1.0, decode_s=1.0, handoff_s=3.0, stall_s=4.0))
    [settle] = [a for a in loader["advice"] if a.startswith("this answer may change")]
    assert "with 2 worker(s) and 13 core(s) free" in settle
    command = settle.split("`")[1]
    assert command.startswith("iobench diagnose --loader hdf5 --storage ")
    assert "--batch-size 32 --workers 2 --compute-time 0.001" in command
    args = build_parser().parse_args(shlex.split(command)[1:])
    config = diagnose_cli.build_config(args)
    assert (config.loader, config.batch_size, config.user_workers) == ("hdf5", 32, 2)
    storage = verdict(_doc(0.6, workers=1, read_s=17.0, decode_s=1.0, stall_s=3.8))
    assert storage["bottleneck"] == "storage"
    assert any("1 worker(s) kept few reads in flight" in a for a in storage["advice"])
    # storage read with many workers, or a loader with no core free: nothing would change
    many = verdict(_doc(0.6, workers=8, read_s=70.0, decode_s=1.0, stall_s=3.8))
    assert many["bottleneck"] == "storage"
    assert not any(a.startswith("this answer may change") for a in many["advice"])
    busy = _doc(0.6, read_s=1.0, decode_s=1.0, handoff_s=3.0, stall_s=4.0)
    busy["provenance"]["cpu_affinity"] = 3
    assert not any(a.startswith("this answer may change") for a in verdict(busy)["advice"])


def test_the_readme_main_job_asks_the_storage_question_on_any_node() -> None:
    """Its training runs emulate a GPU's step, so a node without one still answers about the
    storage (they once trained the CNN on the CPU: both tiers 'kept up')."""
    from test_readme import main_job

    trains = [line for line in main_job() if line.startswith("iobench train")]
    assert len(trains) == 2
    for line in trains:
        assert line.startswith("iobench train --loader hdf5 --storage ")
        assert "--compute-time" in line.split() or "--workload" in line.split()


def test_a_slow_rate_never_prints_as_zero() -> None:
    """CosmoFlow on a CPU trains at about 0.13 samples/s: the verdict once read "ran on the
    CPU at 0 samples/s ... needs 0 samples/s"; below 100 a rate keeps three digits."""
    doc = _doc(0.97)
    doc["compute"] = {"kind": "model", "model": "cosmoflow", "device": {"type": "cpu"}}
    doc["summary"]["spread"]["samples_per_s"] = one_pass(0.131)
    line = verdict(doc)["line"]
    assert "the model ran on the CPU at 0.131 samples/s" in line, line
    slow = verdict(_ceilings(_doc(0.5), 0.5, 12.5, 0.0417))["line"]
    assert "0.5 samples/s cold without decoding" in slow, slow
    assert "12.5 in memory without decoding, 0.0417 in memory decoding" in slow, slow
    assert " 0 samples/s" not in line + slow
