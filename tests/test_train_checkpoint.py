"""`train --checkpoint-every`: the real model saved while it trains, the steps' blocked time, a burst-buffer drain.

A tiny cifar10 dataset and the `cnn` model, a few steps: one process (sync, async with a
drain) and `mpiexec -n 2` (DDP, async, drain); the checkpoints are read back through the
checkpoint store's own checks (marker, metadata without unpickling, tensor shapes) and
loaded with DCP; a rank killed mid-save (IOBENCH_TEST_FAULT action `kill-save`) leaves no
checkpoint a reader accepts.
"""

from __future__ import annotations

import filecmp
import json
import signal
from pathlib import Path

import pytest

from conftest import cli, run_cmd, run_mpi
from iobench.core import results
from iobench.core.checkpoint_store import (
    MARKER,
    CheckpointRefused,
    check_marker,
    check_tensors,
    load_metadata,
    reader,
)
from iobench.core.result_types import TrainResult
from iobench.workflows.train_checkpoint import prune, stall_split

SAMPLES = 256
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
BASE = ["--loader", "hdf5", "--model", "cnn", "--batch-size", "32", "--workers", "1",
        "--max-steps", "4", "--epochs", "2"]


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("ckpt-train")
    assert cli("generate", "--dataset", "cifar10", "--format", "hdf5", "--samples",
               str(SAMPLES), "--storage", s) == 0
    return s


def _result(res: Path) -> dict:
    paths = results.find_results([res])
    assert len(paths) == 1, paths
    return results.load_result(paths[0])


def _one_line_error(stderr: str, words: str) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("iobench: error:")]
    assert len(errors) == 1 and words in errors[0], stderr[-2000:]


def _expected_state() -> dict:
    """What a checkpoint of cifar10's cnn with SGD momentum holds: every key, shape, dtype."""
    import torch

    from iobench.core.models import build_model

    net = build_model("cnn", 10)
    state = {f"model.{k}": torch.zeros_like(v) for k, v in net.state_dict().items()}
    state |= {f"optim.{n}.momentum_buffer": torch.zeros_like(p)
              for n, p in net.named_parameters()}
    return state


def _load(path: Path, ranks: int) -> dict:
    """The checkpoint at `path` loaded as a reader would: checked, then DCP's load."""
    from torch.distributed.checkpoint.state_dict_loader import load

    marker = check_marker(path, ranks)
    assert marker.model == "cnn" and marker.ranks == ranks
    md = load_metadata(path)
    state = _expected_state()
    check_tensors(md, state, path)  # every key of the model, with its shape and dtype
    assert set(md.state_dict_metadata) == set(state)
    load(state, storage_reader=reader(path, md), no_dist=True)
    return state


def _check_figures(doc: dict, saves: int, mode: str) -> None:
    TrainResult.from_dict(doc)  # the typed records hold the new figures
    c = doc["checkpoint"]
    assert c["mode"] == mode and c["every_steps"] == 2 and len(c["saves"]) == saves
    for s in c["saves"]:
        assert s["bytes"] > 100_000 and s["write_s"] > 0 and s["save_s"] >= s["write_s"]
        assert s["blocked_s"] > 0
    for ep in doc["epochs"]:
        ck = ep["checkpoint"]
        assert ck["saves"] == 2 and ck["blocked_s_max"] > 0 and ck["bytes"] > 0
        s = ep["summary"]
        # the blocked time is outside the data stall and the wall; AU both ways. Each rank's
        # wall plus its own blocked time, the slowest rank's: between the slowest wall and
        # the slowest wall plus the longest blocked time (two ranks' maxima may differ)
        eps = 1e-6
        assert s["wall_s"] - eps <= ck["wall_with_checkpoint_s"] \
            <= s["wall_s"] + ck["blocked_s_max"] + eps
        assert ck["wall_with_checkpoint_s"] >= ck["blocked_s_max"]
        if len(ep["ranks"]) == 1:
            assert ck["wall_with_checkpoint_s"] == pytest.approx(
                s["wall_s"] + ck["blocked_s_max"], rel=1e-6)
        assert ck["au_with_checkpoint_mean"] < s["au_mean"]
        for r in ep["ranks"]:
            assert r["stall_s"] + r["compute_s"] == pytest.approx(r["wall_s"], rel=0.02)
    assert c["summary"]["cost_s"] > 0 and 0 < c["summary"]["fraction"] < 1
    assert f"checkpoints ({mode}, every 2 steps" in doc["summary"]["verdict"]["line"]


def test_sync_saves_the_real_model_keeps_the_newest_and_answers(storage, tmp_path,
                                                                 capsys) -> None:
    ck = tmp_path / "ck"
    assert cli("train", "--storage", storage, *BASE, "--results", tmp_path / "res",
               "--checkpoint-every", "2", "--checkpoint-to", ck, "--mtbf", "24") == 0
    out = capsys.readouterr().out
    doc = _result(tmp_path / "res")
    _check_figures(doc, 4, "sync")
    c = doc["checkpoint"]
    assert [Path(p).name for p in c["kept"]] == ["ckpt-002", "ckpt-003"]  # the newest 2
    run_dir = Path(c["to"])
    assert sorted(p.name for p in run_dir.iterdir()) == ["ckpt-002", "ckpt-003"]
    state = _load(run_dir / "ckpt-003", 1)
    assert any(t.abs().sum() > 0 for k, t in state.items() if k.startswith("optim."))
    y = c["summary"]["young"]
    assert y["mtbf_s"] == 24 * 3600 and y["used_steps"] == 2 and y["optimal_steps"] >= 1
    assert y["lost_per_day_s"] <= y["lost_per_day_used_s"]
    assert "Young/Daly's interval is every" in doc["summary"]["verdict"]["line"]
    assert "checkpoints: 4 save(s) (sync, every 2 steps)" in out
    assert "steps blocked" in out and "checkpoint 2 save(s), blocked" in out


def test_async_with_a_drain_commits_an_identical_copy(storage, tmp_path) -> None:
    ck, pfs = tmp_path / "ck", tmp_path / "pfs"
    assert cli("train", "--storage", storage, *BASE, "--results", tmp_path / "res",
               "--checkpoint-every", "2", "--checkpoint-to", ck, "--checkpoint-mode", "async",
               "--drain-to", pfs) == 0
    doc = _result(tmp_path / "res")
    _check_figures(doc, 4, "async")
    c = doc["checkpoint"]
    assert [Path(p).name for p in c["drained"]] == [Path(p).name for p in c["kept"]]
    for local in map(Path, c["kept"]):
        copy = Path(c["drain_to"]) / local.name
        check_marker(copy, 1)
        names = sorted(p.name for p in local.iterdir())
        assert names == sorted(p.name for p in copy.iterdir())
        _, mismatch, errors = filecmp.cmpfiles(local, copy, names, shallow=False)
        assert mismatch == [] and errors == []
        _load(copy, 1)
    for s in c["saves"]:
        assert s["drain"]["bytes"] == s["bytes"] and s["drain"]["drain_s"] > 0
    assert c["summary"]["final_drain_wait_s"] is not None
    for ep in doc["epochs"]:
        d = ep["checkpoint"]["drain"]
        # every step after the first is counted once: with a drain in flight or without
        assert d["steps_in_flight"] + d["steps_idle"] == ep["summary"]["steps"] - 1


@pytest.mark.mpi
@pytest.mark.parametrize("mode, drain", [("sync", False), ("async", True)])
def test_two_ranks_ddp_one_shard_each(storage, tmp_path, mode, drain) -> None:
    ck, pfs, trace = tmp_path / "ck", tmp_path / "pfs", tmp_path / "run.trace.json"
    out = run_mpi(2, "train", "--storage", storage, *BASE, "--results", tmp_path / "res",
                  "--checkpoint-every", "2", "--checkpoint-to", ck, "--checkpoint-mode", mode,
                  *(["--drain-to", pfs] if drain else []), "--trace", trace, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("checkpoints: 4 save(s)") == 1  # rank 0 prints
    doc = _result(tmp_path / "res")
    _check_figures(doc, 4, mode)
    assert len(doc["checkpoint"]["drained"]) == (2 if drain else 0)
    for path in doc["checkpoint"]["kept"] + doc["checkpoint"]["drained"]:
        assert sorted(p.name for p in Path(path).glob("*.distcp")) == [
            "__0_0.distcp", "__1_0.distcp"]
        _load(Path(path), 2)
    for ep in doc["epochs"]:
        assert [r["checkpoint"]["saves"] for r in ep["ranks"]] == [2, 2]
    _check_beside(json.loads(trace.read_text())["traceEvents"], mode, drain)


def _check_beside(events: list[dict], mode: str, drain: bool) -> None:
    """--trace: an async save's write on each rank, the drain on rank 0 only, each save once;
    a sync run without a drain has neither."""
    def which(name: str) -> list[tuple[int, int]]:
        return sorted((e["pid"], e["args"]["checkpoint"]) for e in events
                      if e.get("ph") == "X" and e["name"] == name)

    saves = range(4)
    assert which("checkpoint") == [(r, k) for r in (0, 1) for k in saves]
    assert which("checkpoint_write") == ([(r, k) for r in (0, 1) for k in saves]
                                         if mode == "async" else [])
    assert which("drain") == ([(0, k) for k in saves] if drain else [])


# ------------------------------------------------------------------------ refusals

@pytest.mark.parametrize("argv, words", [
    (["--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint-to DIR"),
    (["--checkpoint-to", "{ck}"], "add --checkpoint-every N"),
    (["--mtbf", "24"], "add --checkpoint-every N"),
    (["--checkpoint-every", "0", "--checkpoint-to", "{ck}"], "--checkpoint-every 0"),
    (["--checkpoint-every", "2", "--checkpoint-to", "{ck}", "--drain-to", "{ck}"],
     "must be apart"),
])
def test_bad_options_are_one_line_and_exit_2(storage, tmp_path, capsys, argv, words) -> None:
    argv = [a.format(ck=tmp_path / "ck") for a in argv]
    assert cli("train", "--storage", storage, *BASE, "--results", tmp_path / "res",
               *argv) == 2
    _one_line_error(capsys.readouterr().err, words)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "res").exists()


def test_no_real_model_is_refused(storage, tmp_path, capsys) -> None:
    assert cli("train", "--storage", storage, "--loader", "hdf5", "--compute-time", "0.01",
               "--checkpoint-every", "2", "--checkpoint-to", tmp_path / "ck") == 2
    _one_line_error(capsys.readouterr().err, "needs a real model")


def test_a_checkpoint_folder_inside_the_dataset_is_refused(storage, tmp_path, capsys) -> None:
    inside = storage / "cifar10-hdf5" / "ck"
    assert cli("train", "--storage", storage, *BASE, "--results", tmp_path / "res",
               "--checkpoint-every", "2", "--checkpoint-to", inside) == 2
    _one_line_error(capsys.readouterr().err, "inside the dataset")
    assert not inside.exists()
    assert cli("train", "--storage", storage, *BASE, "--results", tmp_path / "res",
               "--checkpoint-every", "2", "--checkpoint-to", tmp_path / "ck",
               "--drain-to", inside) == 2
    _one_line_error(capsys.readouterr().err, "--drain-to")
    assert not inside.exists()


# ------------------------------------------------------------------------ a kill mid-save

def test_a_kill_mid_save_leaves_no_checkpoint_a_reader_accepts(storage, tmp_path) -> None:
    """Killed after its shard is written, before DCP's metadata and the marker, in the
    second save: the first stays whole, the second is a .partial folder refused."""
    ck = tmp_path / "ck"
    out = run_cmd("train", "--storage", storage, *BASE, "--results", tmp_path / "res",
                  "--checkpoint-every", "2", "--checkpoint-to", ck,
                  env={"IOBENCH_TEST_FAULT": "rank=0,epoch=1,action=kill-save"}, timeout=240)
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    (run_dir,) = ck.iterdir()
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == [".ckpt-001.partial", "ckpt-000"]
    with pytest.raises(CheckpointRefused, match="no completion marker"):
        check_marker(run_dir / ".ckpt-001.partial")
    assert not (run_dir / ".ckpt-001.partial" / MARKER).exists()
    _load(run_dir / "ckpt-000", 1)
    assert not list((tmp_path / "res").glob("*.json"))  # a killed job writes no result


def test_an_interrupt_waits_for_the_save_and_drain_in_flight(storage, tmp_path) -> None:
    """Ctrl-C with an async save and a drain in flight: exit 130, the epochs that completed
    written, nothing left that looks complete and is not, no unfinished folder."""
    ck, pfs = tmp_path / "ck", tmp_path / "pfs"
    out = run_cmd("train", "--storage", storage, *BASE, "--results", tmp_path / "res",
                  "--checkpoint-every", "1", "--checkpoint-to", ck, "--checkpoint-mode", "async",
                  "--drain-to", pfs,
                  env={"IOBENCH_TEST_FAULT": "rank=0,epoch=1,step=1,action=sigint"}, timeout=240)
    assert out.returncode == 130, out.stderr[-3000:]
    doc = _result(tmp_path / "res")
    assert doc["status"] == "interrupted" and len(doc["epochs"]) == 1
    for tier in (ck, pfs):
        (run_dir,) = tier.iterdir()
        left = sorted(run_dir.iterdir())
        assert left and len(left) <= 2 and all(p.name.startswith("ckpt-") for p in left)
        for p in left:
            _load(p, 1)


# ------------------------------------------------------------------------ pieces

def test_stall_split_counts_each_step_once() -> None:
    steps = [(0, 10), (20, 30), (40, 55), (60, 61)]
    busy = [(25, 45), (58, None)]  # the second drain still running
    d = stall_split(steps, busy, now=100)
    assert (d["steps_in_flight"], d["steps_idle"]) == (3, 1)
    assert d["stall_in_flight_s"] == pytest.approx((10 + 15 + 1) / 1e9)
    assert d["stall_per_step_idle_s"] == pytest.approx(10 / 1e9)


def test_prune_keeps_the_newest_complete_and_the_protected(tmp_path) -> None:
    for k in (1, 2, 3, 10):
        d = tmp_path / f"ckpt-{k:03d}"
        d.mkdir()
        (d / MARKER).write_text(json.dumps({}))
    (tmp_path / ".ckpt-011.partial").mkdir()
    prune(tmp_path, 2, frozenset({"ckpt-001"}))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".ckpt-011.partial", "ckpt-001", "ckpt-003", "ckpt-010"]
