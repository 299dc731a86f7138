"""`train --resume`: the newest complete checkpoint carried on from, never a partial one.

A tiny cifar10 dataset and the `cnn` model (4 steps an epoch, a save every 2 steps). One
run killed during its fourth save (IOBENCH_TEST_FAULT `kill-save`: after its shard is
written, before the metadata and the marker) is the module's fixture: a resumed run takes
the third save (step 6, mid-epoch 2), not the `.partial` folder; the weights and momentum
it loads through DCP are the saved ones. A tiny full filesystem ends the run in one line
and leaves the previous checkpoint, which a resume takes; a checkpoint of another model or
world size is refused in one line; `mpiexec -n 2` resumes one shard per rank.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from conftest import cli, run_cmd, run_mpi
from iobench.core import results
from iobench.core.checkpoint_store import check_marker, load_metadata, reader
from iobench.core.world import World
from iobench.workflows.train_checkpoint import CheckpointPlan, TrainCheckpoints
from iobench.workflows.train_resume import newest_complete, read_state

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
BASE = ["--loader", "hdf5", "--model", "cnn", "--batch-size", "32", "--workers", "0",
        "--max-steps", "4", "--checkpoint-every", "2"]


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("resume-data")
    assert cli("generate", "--dataset", "cifar10", "--format", "hdf5", "--samples", "128",
               "--storage", s) == 0
    return s


@pytest.fixture(scope="module")
def killed(storage, tmp_path_factory) -> Path:
    """A run killed during its fourth save (step 8): ckpt-001 (step 4), ckpt-002 (step 6)
    complete, `.ckpt-003.partial` without a marker."""
    ck = tmp_path_factory.mktemp("resume-killed") / "ck"
    out = run_cmd("train", "--storage", storage, *BASE, "--epochs", "2", "--checkpoint-to", ck,
                  "--results", ck.parent / "res",
                  env={"IOBENCH_TEST_FAULT": "rank=0,epoch=3,action=kill-save"}, timeout=240)
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    (run_dir,) = ck.iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == [".ckpt-003.partial", "ckpt-001",
                                                         "ckpt-002"]
    return ck


def _copy(ck: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "ck"
    shutil.copytree(ck, dest)
    return dest


def _result(res: Path) -> dict:
    (path,) = results.find_results([res])
    return results.load_result(path)


def _one_line_error(stderr: str, *words: str) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("iobench: error:")]
    assert len(errors) == 1 and all(w in errors[0] for w in words), stderr[-2000:]


def _saved(path: Path) -> dict:
    """The checkpoint's tensors, loaded with DCP through the store's checks."""
    import torch
    from torch.distributed.checkpoint.state_dict_loader import load

    check_marker(path)
    md = load_metadata(path)
    state = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
             for k, v in md.state_dict_metadata.items()}
    load(state, storage_reader=reader(path, md), no_dist=True)
    return state


# ------------------------------------------------------------------------ a kill, then resume

def test_a_resume_after_a_kill_carries_on_from_the_last_complete_save(killed, storage,
                                                                      tmp_path, capsys) -> None:
    ck = _copy(killed, tmp_path)
    old = next(ck.iterdir())
    assert cli("train", "--storage", storage, *BASE, "--epochs", "2", "--checkpoint-to", ck,
               "--resume", "--results", tmp_path / "res") == 0
    out = capsys.readouterr().out
    doc = _result(tmp_path / "res")
    r = doc["checkpoint"]["resumed"]
    assert Path(r["path"]) == old / "ckpt-002"  # not the .partial one
    assert (r["step"], r["epoch"], r["epoch_step"]) == (6, 1, 2) and r["bytes"] > 100_000
    # only what this run measured: the 2 steps left of epoch 2, one save (step 8)
    assert [(e["epoch"], e["summary"]["steps"]) for e in doc["epochs"]] == [(1, 2)]
    (save,) = doc["checkpoint"]["saves"]
    assert (save["step"], save["epoch"]) == (8, 1)
    s = read_state(Path(save["path"]))
    assert (s.step, s.epoch, s.epoch_step, s.run_id) == (8, 1, 4, doc["run_id"])
    assert "resumed from step 6 (epoch 2, 2 of its steps done)" in doc["summary"]["verdict"]["line"]
    assert "resumed from step 6" in out
    assert (old / ".ckpt-003.partial").is_dir()  # left as it was, never read


def test_the_loaded_weights_are_the_saved_ones(killed, tmp_path) -> None:
    """Before the first resumed step: the model's tensors and SGD's momentum equal the
    checkpoint's, read back with DCP; the steps count on from 6, mid-epoch 2."""
    import torch

    from iobench.core.models import build_model

    ck = _copy(killed, tmp_path)
    saved = _saved(next(ck.iterdir()) / "ckpt-002")
    plan = CheckpointPlan(every_steps=2, to=str(ck), resume=True)
    tc = TrainCheckpoints(plan, World(), "test-run", "cnn", 0, 60.0, "cifar10", 32)
    tc.open()
    model = build_model("cnn", 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert any(not torch.equal(v, saved[f"model.{k}"])
               for k, v in model.state_dict().items() if v.is_floating_point())
    try:
        tc.start_repetition(0, model, opt)
        assert tc.steps == 6 and tc.first_epoch(4, 2) == 1
        tc.epoch_start()
        assert tc.done_before == 2
    finally:
        tc.close()
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[f"model.{k}"]), k
    momentum = {n: opt.state[p]["momentum_buffer"] for n, p in model.named_parameters()}
    assert momentum and all(torch.equal(m, saved[f"optim.{n}.momentum_buffer"])
                            for n, m in momentum.items())
    assert any(m.abs().sum() > 0 for m in momentum.values())


def test_a_damaged_newest_checkpoint_is_passed_over_and_said(killed, tmp_path) -> None:
    """ckpt-002's `.metadata` altered after its commit: its marker's checksum refuses it, so
    the resume takes ckpt-001 and says why ckpt-002 was not taken."""
    ck = _copy(killed, tmp_path)
    run_dir = next(ck.iterdir())
    with open(run_dir / "ckpt-002" / ".metadata", "r+b") as f:
        f.write(b"X")
    point = newest_complete(ck)
    assert point.path == run_dir / "ckpt-001" and point.state.step == 4
    (why,) = point.skipped
    assert "ckpt-002" in why and "checksum" in why


# ------------------------------------------------------------------------ refusals

def test_a_checkpoint_of_another_model_is_refused_in_one_line(killed, storage, tmp_path,
                                                              capsys) -> None:
    ck = _copy(killed, tmp_path)
    argv = [a if a != "cnn" else "resnet18" for a in BASE]
    assert cli("train", "--storage", storage, *argv, "--checkpoint-to", ck, "--resume",
               "--results", tmp_path / "res") == 2
    _one_line_error(capsys.readouterr().err, "model cnn", "resnet18", "--model cnn")
    assert len(list(ck.iterdir())) == 1  # no folder of its own made


def test_a_resume_with_nothing_left_to_train_is_refused(killed, storage, tmp_path,
                                                        capsys) -> None:
    ck = _copy(killed, tmp_path)
    assert cli("train", "--storage", storage, *BASE, "--epochs", "1", "--checkpoint-to", ck,
               "--resume", "--results", tmp_path / "res") == 2
    _one_line_error(capsys.readouterr().err, "nothing", "raise --epochs above 1")


@pytest.mark.parametrize("argv, words", [
    (["--checkpoint-to", "{ck}", "--resume"], "add --checkpoint-every N"),
    (["--checkpoint-every", "2", "--checkpoint-to", "{ck}", "--resume", "--repeat", "2"],
     "--resume carries one training run on"),
    (["--checkpoint-every", "2", "--checkpoint-to", "{ck}", "--resume"],
     "no complete training checkpoint"),
])
def test_bad_resumes_are_one_line_and_exit_2(storage, tmp_path, capsys, argv, words) -> None:
    (tmp_path / "ck").mkdir()
    argv = [a.format(ck=tmp_path / "ck") for a in argv]
    base = BASE[:-2]  # without --checkpoint-every
    assert cli("train", "--storage", storage, *base, "--results", tmp_path / "res", *argv) == 2
    _one_line_error(capsys.readouterr().err, words)
    assert list((tmp_path / "ck").iterdir()) == []


# ------------------------------------------------------------------------ a full disk

@pytest.fixture
def tiny_fs(tmpfs):
    """An 8 MB tmpfs (room for the checks before the run, filled by the fault; conftest's `tmpfs`)."""
    return tmpfs("8m")


def test_a_full_disk_is_one_line_and_the_previous_save_resumes(storage, tiny_fs, tmp_path,
                                                               capsys, monkeypatch) -> None:
    """Another writer fills the filesystem before the second save (IOBENCH_TEST_FAULT
    `fill`): one line, exit 2, the first save whole; once space is freed, a resume takes it."""
    argv = ["train", "--storage", storage, *BASE, "--epochs", "1", "--checkpoint-keep", "1",
            "--checkpoint-to", tiny_fs]
    with monkeypatch.context() as m:
        m.setenv("IOBENCH_TEST_FAULT", "rank=0,epoch=1,action=fill")
        assert cli(*argv, "--results", tmp_path / "res") == 2
    _one_line_error(capsys.readouterr().err, "out of space")
    (run_dir,) = tiny_fs.glob("iobench-train-*")
    assert sorted(p.name for p in run_dir.iterdir()) == ["ckpt-000"]
    assert read_state(run_dir / "ckpt-000").step == 2
    (tiny_fs / "filler").unlink()  # the other writer's file gone
    assert cli(*argv, "--resume", "--results", tmp_path / "res2") == 0
    doc = _result(tmp_path / "res2")
    assert Path(doc["checkpoint"]["resumed"]["path"]) == run_dir / "ckpt-000"
    assert [e["summary"]["steps"] for e in doc["epochs"]] == [2]


# ------------------------------------------------------------------------ two ranks

@pytest.mark.mpi
def test_two_ranks_resume_one_shard_each_and_one_rank_is_refused(storage, tmp_path,
                                                                 capsys) -> None:
    """Rank 1 killed during the second save (2 steps an epoch each): a one-rank resume is
    refused (world size 2), two ranks resume from the first save (step 2, epoch 1's end)
    with epoch 2, each loading and saving its shard."""
    ck = tmp_path / "ck"
    argv = ["train", "--storage", storage, *BASE, "--epochs", "2", "--checkpoint-to", ck]
    out = run_mpi(2, *argv, "--results", tmp_path / "res",
                  env={"IOBENCH_TEST_FAULT": "rank=1,epoch=1,action=kill-save"}, timeout=240)
    assert out.returncode != 0
    (run_dir,) = ck.iterdir()
    assert [p.name for p in run_dir.glob("ckpt-*")] == ["ckpt-000"]
    assert cli(*argv, "--resume", "--results", tmp_path / "r1") == 2
    _one_line_error(capsys.readouterr().err, "world size 2", "mpiexec -n 2")
    out = run_mpi(2, *argv, "--resume", "--results", tmp_path / "res2", timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = _result(tmp_path / "res2")
    assert doc["checkpoint"]["resumed"]["step"] == 2 and doc["world"]["size"] == 2
    assert [(e["epoch"], e["summary"]["steps"]) for e in doc["epochs"]] == [(1, 2)]
    (save,) = doc["checkpoint"]["saves"]
    assert save["step"] == 4
    assert sorted(p.name for p in Path(save["path"]).glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]
    assert out.stdout.count("resumed from step 2") == 2  # the checkpoint line and the verdict


# ------------------------------------------------------------------------ --trace

def test_a_trace_draws_the_time_saves_blocked_the_steps(storage, tmp_path) -> None:
    """`--trace` with `--checkpoint-every 2`: each save is a span of category `checkpoint`
    in its own lane, from the end of its step's compute to the next step's wait, as long as
    the step was blocked; the steps after it are drawn after it."""
    import json

    trace_file = tmp_path / "run.trace.json"
    assert cli("train", "--storage", storage, *BASE, "--epochs", "1", "--checkpoint-to",
               tmp_path / "ck", "--trace", trace_file, "--results", tmp_path / "res") == 0
    doc = _result(tmp_path / "res")
    trace = json.loads(trace_file.read_text())
    assert trace["otherData"]["iobench"]["spans"]["checkpoint"].startswith("measured")
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    saves = [e for e in events if e.get("cat") == "checkpoint"]
    assert [e["args"]["step"] for e in saves] == [1, 3] and {e["tid"] for e in saves} == {5}
    blocked = [s["blocked_s"] for s in doc["checkpoint"]["saves"]]
    assert [e["dur"] / 1e6 for e in saves] == pytest.approx(blocked, abs=2e-6)
    step = {(e["name"], e["args"]["step"]): e for e in events if e["name"] in ("wait", "compute")}
    first = saves[0]
    assert first["ts"] == pytest.approx(step[("compute", 1)]["ts"] + step[("compute", 1)]["dur"],
                                        abs=2e-3)
    assert step[("wait", 2)]["ts"] == pytest.approx(first["ts"] + first["dur"], abs=2e-3)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert "checkpoint (steps blocked)" in names
