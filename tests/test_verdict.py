"""The verdict a run ends with: keeps up or starved, by what, and what to do about it.

Each class is checked on a constructed case: a document with known clocks,
and real runs where the cause is built in (an emulated Lustre for storage,
JPEG decoding on one worker for the CPU, a slow hand-off for the loader).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import cli
from iobench.core import results
from iobench.core.errors import ConfigError
from iobench.core.world import World
from iobench.loaders import make_loader
from iobench.loaders.base import Batch
from iobench.workflows.train import TrainConfig, run
from iobench.workflows.verdict import for_run, parse_threshold, verdict
from result_docs import one_pass, probe_doc, real_result
from wrappers import Wrapped


def _doc(au: float, *, workers: int = 2, read_s: float = 0.0, decode_s: float = 0.0,
         handoff_s: float = 0.0, stall_s: float = 1.0, wall_s: float = 10.0,
         fstype: str = "lustre", kind: str = "parallel", fmt: str = "hdf5") -> dict:
    """A real result (one epoch, one rank, one node) with the given clocks and figures."""
    doc = real_result()
    ep = doc["epochs"][0]
    ep["summary"].update(wall_s=wall_s, au_mean=au)
    rank = ep["ranks"][0]
    rank.update(stall_s=stall_s, loader={"workers": workers, "batches": 100, "read_s": read_s,
                                         "decode_s": decode_s, "handoff_s": handoff_s})
    ep["ranks"] = [rank]
    doc["epochs"] = [ep]
    doc["summary"] = {"spread": {"au": one_pass(au), "read_MBps": one_pass(410.0),
                                 "stall_fraction": one_pass(stall_s / wall_s)}}
    doc["config"].update(workers=workers, worker_type="process")
    doc["compute"] = {"kind": "emulated", "device": {"type": "cpu"}}
    doc["world"]["local_size"] = 1
    doc["provenance"].update(cpu_affinity=16, storage={"fstype": fstype, "kind": kind})
    doc["dataset"].update(dataset="cifar10", format=fmt, total_bytes=3072 * 1000,
                          num_samples=1000)
    return doc


PROBE = probe_doc("/", 440.0)


def test_each_class_from_the_clocks() -> None:
    keeps = verdict(_doc(0.97, read_s=1.0))
    assert (keeps["status"], keeps["bottleneck"]) == ("keeps up", "none")
    assert keeps["line"].startswith("verdict: keeps up - AU 0.97 >= 0.90")

    storage = verdict(_doc(0.62, read_s=17.0, decode_s=1.0, stall_s=3.8), probe=PROBE,
                      break_even={"break_even_epochs": 1.4})
    assert (storage["status"], storage["bottleneck"]) == ("starved", "storage")
    assert storage["line"].startswith("verdict: starved by storage - AU 0.62 < 0.90")
    assert "reads at 410 MB/s = 0.93 of lustre (parallel)'s probed limit" in storage["line"]
    assert "pays off after 1.4 epochs" in storage["line"]
    # a break-even within the runs' spread gives no number (the sweep's 0.39 s vs 0.38 s)
    ns = verdict(_doc(0.62, read_s=17.0, decode_s=1.0, stall_s=3.8), probe=PROBE,
                 break_even={"break_even_epochs": 40.0, "significant": False})
    assert "pays off" not in ns["line"] and "not significant" in ns["line"], ns["line"]

    cpu = verdict(_doc(0.5, read_s=2.0, decode_s=16.0))
    assert cpu["bottleneck"] == "cpu" and any("--workers" in a for a in cpu["advice"])

    loader = verdict(_doc(0.6, read_s=1.0, decode_s=1.0, handoff_s=3.0, stall_s=4.0))
    assert loader["bottleneck"] == "loader"
    assert any("--worker-type thread" in a for a in loader["advice"])

    no_clocks = _doc(0.6)
    no_clocks["epochs"][0]["ranks"][0]["loader"] = None
    assert verdict(no_clocks)["bottleneck"] == "unknown"
    assert verdict(_doc(0.85, read_s=1.0), threshold=0.8)["status"] == "keeps up"


def _with_workers(doc: dict, per_batch_s: list[float], batches: int = 10) -> dict:
    doc["epochs"][0]["ranks"][0]["loader"]["per_worker"] = [
        {"worker": w, "batches": batches, "read_s": t * batches * 0.8,
         "decode_s": t * batches * 0.2, "busy_fraction": 0.5}
        for w, t in enumerate(per_batch_s)]
    return doc


def test_a_slow_worker_is_named_as_imbalance() -> None:
    slow = verdict(_with_workers(_doc(0.6, read_s=17.0, decode_s=1.0),
                                 [0.05, 0.05, 0.05, 0.2]))
    assert slow["bottleneck"] == "storage"  # the class still comes from the clocks
    [ev] = [e for e in slow["evidence"] if e.startswith("imbalance")]
    assert "worker 3 of rank 0 took 4.0x its rank's median time per batch" in ev
    assert "(200 ms vs 50 ms)" in ev
    assert any("slow worker" in a for a in slow["advice"])
    assert "imbalance: worker 3" in slow["line"]
    # a worker that made more batches at the same time per batch is busier, not slower
    even = _with_workers(_doc(0.6, read_s=17.0, decode_s=1.0), [0.05, 0.05, 0.05, 0.05])
    even["epochs"][0]["ranks"][0]["loader"]["per_worker"][0].update(
        batches=30, read_s=0.05 * 30, decode_s=0.0)
    assert not any(e.startswith("imbalance") for e in verdict(even)["evidence"])
    # 1.5x is the line: just under it is no imbalance, over it is
    assert not any("imbalance" in e for e in verdict(_with_workers(
        _doc(0.6, read_s=17.0), [0.1, 0.1, 0.149]))["evidence"])
    assert any("imbalance" in e for e in verdict(_with_workers(
        _doc(0.6, read_s=17.0), [0.1, 0.1, 0.151]))["evidence"])


def test_dali_unknown_says_why_and_what_to_run() -> None:
    doc = _doc(0.5, fmt="lmdb")
    doc["config"]["loader"] = "dali"
    doc["epochs"][0]["ranks"][0]["loader"] = None  # DALI's pipeline keeps no clocks of ours
    v = verdict(doc)
    assert (v["status"], v["bottleneck"]) == ("starved", "unknown")
    assert v["line"].startswith("verdict: starved (cause unknown) - AU 0.50 < 0.90")
    assert any("DALI reads and decodes inside its own pipeline" in e for e in v["evidence"])
    [advice] = v["advice"]
    for what in ("--no-decode --model none", "--loader lmdb",
                 "iobench bench-read --loaders lmdb,dali"):
        assert what in advice
    # DALI that keeps up needs no cause
    doc["summary"]["spread"]["au"]["median"] = 0.95
    assert verdict(doc)["bottleneck"] == "none"


def test_threshold_is_validated() -> None:
    assert parse_threshold(0.7) == 0.7
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="--au-threshold"):
            parse_threshold(bad)


@pytest.fixture(scope="module")
def cifar(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("v-cifar")
    assert cli("generate", "--dataset", "cifar10", "--samples", "1024", "--storage", s) == 0
    return s


def test_a_real_models_run_states_its_measured_demand(cifar: Path, tmp_path: Path) -> None:
    """train measures the model's compute-only rate (its input resident on the device) and
    the verdict sets it against what the loader delivered."""
    assert cli("train", "--loader", "hdf5", "--storage", cifar, "--model", "cnn",
               "--epochs", "1", "--max-steps", "4", "--batch-size", "32",
               "--results", tmp_path) == 0
    doc = results.load_typed(results.find_results([tmp_path])[0])
    d = doc.compute.demand
    assert d is not None and d.batch_size == 32 and d.samples_per_s > 0 and d.steps >= 1
    assert abs(d.samples_per_s * d.ms_per_step / 1e3 - 32) < 1e-6
    line = doc.summary.verdict.line
    assert f"cnn (batch 32) on this {doc.compute.device.name} needs" in line
    assert "the loader delivered" in line


def test_every_train_ends_with_a_verdict(cifar: Path, tmp_path: Path, capsys) -> None:
    assert cli("train", "--loader", "hdf5", "--storage", cifar, "--compute-time", "0.2",
               "--epochs", "1", "--max-steps", "4", "--results", tmp_path) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    doc = results.load_result(results.find_results([tmp_path])[0])
    v = doc["summary"]["verdict"]
    assert last == v["line"] and last.startswith("verdict: ")
    assert v["status"] in ("keeps up", "starved") and v["threshold"] == 0.9
    assert cli("compare", tmp_path) == 0
    assert v["line"][:40] in " ".join(capsys.readouterr().out.split())


def test_decoding_on_one_worker_is_the_cpu(tmp_path: Path) -> None:
    assert cli("generate", "--dataset", "imagenet", "--samples", "128", "--storage",
               tmp_path) == 0
    assert cli("train", "--loader", "hdf5", "--dataset", "imagenet", "--storage", tmp_path,
               "--compute-time", "0.005", "--epochs", "1", "--workers", "1",
               "--batch-size", "16", "--results", tmp_path / "r") == 0
    doc = results.load_result(results.find_results([tmp_path / "r"])[0])
    v = doc["summary"]["verdict"]
    assert (v["status"], v["bottleneck"]) == ("starved", "cpu"), v["line"]


class SlowHandOff(Wrapped):
    """Batches arrive made, then wait `delay_s` before the step gets them (a slow hand-off)."""

    delay_s = 0.03

    def epoch(self, epoch: int) -> Iterator[Batch]:
        for batch in self.inner.epoch(epoch):
            time.sleep(self.delay_s)
            yield batch


def test_a_slow_hand_off_is_the_loader(cifar: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(loader="hdf5", storage=str(cifar), compute_time_s=0.005, epochs=1,
                      batch_size=64, workers=1, results=str(tmp_path))
    doc = run(cfg, lambda m, c, r, w: SlowHandOff(make_loader("hdf5", m, c, r, w)), World())
    v = verdict(doc)
    assert (v["status"], v["bottleneck"]) == ("starved", "loader"), v["line"]
    assert "waiting to be handed over" in v["line"]


def test_an_emulated_lustre_is_the_storage(cifar: Path, tmp_path: Path) -> None:
    from iobench.pfs import fuse_problem, mount

    problem = fuse_problem()
    if problem:
        pytest.skip(f"FUSE unusable: {problem}")
    mnt = tmp_path / "pfs"
    with mount(cifar, mnt, "lustre-busy"):
        assert cli("train", "--loader", "hdf5", "--storage", mnt, "--compute-time", "0.005",
                   "--epochs", "1", "--workers", "1", "--max-steps", "12",
                   "--results", tmp_path / "r") == 0
    doc = results.load_result(results.find_results([tmp_path / "r"])[0])
    v = for_run(doc, str(tmp_path / "r"), 0.9)
    assert (v["status"], v["bottleneck"]) == ("starved", "storage"), v["line"]
    assert any("--stage-to" in a for a in v["advice"])


def test_the_breakdown_is_per_worker(cifar: Path, tmp_path: Path) -> None:
    """Each worker's batches, read and decode time, and busy part of the epoch, from the
    clocks its batches carry; together they make the rank's totals."""
    assert cli("train", "--loader", "hdf5", "--storage", cifar, "--compute-time", "0.01",
               "--epochs", "1", "--max-steps", "12", "--workers", "2",
               "--results", tmp_path) == 0
    doc = results.load_result(results.find_results([tmp_path])[0])
    lt = doc["epochs"][0]["ranks"][0]["loader"]
    per = lt["per_worker"]
    assert [w["worker"] for w in per] == [0, 1]  # batches come from every worker
    assert sum(w["batches"] for w in per) == lt["batches"] == 12
    assert sum(w["read_s"] for w in per) == pytest.approx(lt["read_s"])
    assert all(0 < w["busy_fraction"] <= 1.0 for w in per)


def _nodes(doc: dict, stalls: list[float], wall_s: float = 10.0) -> dict:
    node = doc["epochs"][0]["per_node"][0]  # a real node record, figures replaced
    doc["epochs"][0]["per_node"] = [{**node, "node": i, "name": f"n{i + 1}", "stall_s": s,
                                     "wall_s": wall_s, "samples": 100}
                                    for i, s in enumerate(stalls)]
    return doc


def test_the_verdict_names_straggler_nodes_over_1_5x_the_median() -> None:
    slow = verdict(_nodes(_doc(0.62, read_s=17.0, stall_s=3.8), [1.0, 1.1, 0.9, 2.4]))
    (s,) = slow["stragglers"]
    assert (s["name"], s["stall_s"], s["median_stall_s"]) == ("n4", 2.4, 1.05)
    assert "straggler node(s): n4 (stall 2.4 s, 2.3x the median node's 1.05 s)" in slow["line"]
    assert "look at n4 first" in slow["line"]
    # 1.5x the median exactly is not over it; a run that keeps up still names its straggler
    assert verdict(_nodes(_doc(0.62, read_s=17.0), [1.0, 1.5, 1.0]))["stragglers"] == []
    keeps = verdict(_nodes(_doc(0.97, read_s=1.0), [0.2, 0.9]))
    assert [s["name"] for s in keeps["stragglers"]] == ["n2"]
    # noise on a run with almost no stall names nobody (under 1 % of the wall above the median)
    assert verdict(_nodes(_doc(0.97, read_s=1.0), [0.001, 0.004]))["stragglers"] == []
    # one node, or a result before per-node figures: nothing to compare
    assert verdict(_nodes(_doc(0.62, read_s=17.0), [3.0]))["stragglers"] == []
    assert verdict(_doc(0.62, read_s=17.0))["stragglers"] == []


def test_au_is_printed_with_the_digits_that_tell_it_from_the_threshold():
    from iobench.workflows.verdict import au_words

    assert au_words(0.62, 0.9, "<") == "0.62 < 0.90"
    assert au_words(0.898, 0.9, "<") == "0.898 < 0.900"  # once "AU 0.90 < 0.90"
    assert au_words(0.9004, 0.9, ">=") == "0.9004 >= 0.9000"
    assert au_words(0.9, 0.9, ">=") == "0.90 >= 0.90"


def test_pure_ingest_reports_its_rate_not_a_starved_accelerator(cifar: Path,
                                                                 tmp_path: Path) -> None:
    """--model none has no accelerator to starve (it once read 'starved ... AU 0.00')."""
    assert cli("train", "--loader", "hdf5", "--storage", cifar, "--model", "none",
               "--epochs", "1", "--max-steps", "4", "--results", tmp_path) == 0
    v = results.load_typed(results.find_results([tmp_path])[0]).summary.verdict
    assert v.status == "ingest" and v.line.startswith("verdict: pure ingest - no accelerator")
    assert "samples/s" in v.line and "starved" not in v.line
