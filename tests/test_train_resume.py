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
from iobench.core.manifest import Manifest
from iobench.core.world import World
from iobench.workflows import compare
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
    assert "epoch 2/2 (resumed at step 3): 2 steps" in out  # its line, and the table's row
    assert "2 (resumed at step 3)" in out.split("run ")[-1]
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


# ------------------------------------------------------------------------ the resumed epoch's samples

def _record_batches(monkeypatch, loader_cls) -> list[tuple[int, list[int], int]]:
    """Each batch the training loop takes from `loader_cls` (a real loader, reading real
    files): (epoch, its sample indices, its payload bytes)."""
    seen: list[tuple[int, list[int], int]] = []
    original = loader_cls.epoch

    def epoch(self, epoch, start_step=0):
        for b in original(self, epoch, start_step) if start_step else original(self, epoch):
            seen.append((epoch, b.indices.tolist(), b.payload_bytes))
            yield b

    monkeypatch.setattr(loader_cls, "epoch", epoch)
    return seen


@pytest.fixture(scope="module")
def files_storage(tmp_path_factory) -> Path:
    """256 cifar10 samples, one file each: the OS reads a sample's file and nothing of the
    others' (no readahead across files), so an epoch's read bytes follow its samples."""
    s = tmp_path_factory.mktemp("resume-files")
    assert cli("generate", "--dataset", "cifar10", "--format", "files", "--samples", "256",
               "--storage", s) == 0
    return s


@pytest.mark.parametrize("loader", ["files", "dali"])
def test_a_resumed_epoch_reads_the_tail_of_the_same_order(files_storage, tmp_path, monkeypatch,
                                                          loader) -> None:
    """An epoch of 8 steps with a save every 4; the save at step 8 removed, so a resume
    carries on from step 4 of the epoch: it reads exactly the batches 5-8 the run without
    a failure read (same shuffled order, same batches), none of the first four, and its
    epoch says so; its payload is those 4 batches', and its OS read bytes their files'."""
    if loader == "dali":
        from iobench.loaders.dali import DaliLoader as cls
    else:
        from iobench.loaders.files import FilesLoader as cls
    seen = _record_batches(monkeypatch, cls)
    argv = ["train", "--storage", files_storage, "--loader", loader, "--model", "cnn",
            "--batch-size", "32", "--workers", "1", "--epochs", "1", "--checkpoint-every",
            "4", "--checkpoint-to", tmp_path / "ck"]
    assert cli(*argv, "--results", tmp_path / "whole") == 0
    # the epoch's batches (DALI's ceilings passes read epochs after it: not the training's)
    whole, full = seen[:8], _result(tmp_path / "whole")
    assert len(whole) == 8 and len({i for _, b, _ in whole for i in b}) == 256
    (run_dir,) = (tmp_path / "ck").iterdir()
    shutil.rmtree(run_dir / "ckpt-001")  # the save at step 8: as if the run died before it
    seen.clear()
    assert cli(*argv, "--resume", "--results", tmp_path / "resumed") == 0
    doc = _result(tmp_path / "resumed")
    assert doc["checkpoint"]["resumed"]["epoch_step"] == 4
    assert seen[:4] == whole[4:]  # the tail of the same order, batch for batch
    (ep,) = doc["epochs"]
    assert ep["resumed"] == {"steps_before": 4, "samples_skipped": 128}
    assert ep["summary"]["steps"] == 4
    (row,) = compare.comparison_rows([doc])  # compare says so beside whole epochs
    assert row["resumed_at"] == 4
    (rank,) = ep["ranks"]
    assert rank["batch_bytes"] == sum(n for _, _, n in whole[4:])
    (full_rank,) = full["epochs"][0]["ranks"]
    assert full_rank["batch_bytes"] == sum(n for _, _, n in whole)
    if rank["os_read_bytes"] is not None:  # null where the OS does not count reads
        # a file's pages, read cold: the tail's files, not the whole epoch's
        m = Manifest.load(next(files_storage.glob("cifar10-*")))
        pages = lambda idx: sum(-(-m.data_files[i].bytes // 4096) * 4096 for i in idx)  # noqa: E731
        tail = pages(i for _, b, _ in whole[4:] for i in b)
        rest = pages(i for _, b, _ in whole[:4] for i in b)
        assert tail <= rank["os_read_bytes"] < tail + rest / 2, (rank["os_read_bytes"], tail)


@pytest.mark.parametrize("mode, scope", [("global", "global"), ("block", "global"),
                                         ("none", "global"), ("global", "local")])
def test_the_order_starts_part_way_without_building_another(mode, scope) -> None:
    """`rank_indices(..., start=k)` is the rank's share of the same order without its first k
    samples, on every rank; past the share's end it is a ConfigError."""
    from iobench.core.errors import ConfigError
    from iobench.core.sampling import rank_indices

    kw = {"block_size": 8, "window": 2, "scope": scope,
          "file_ranges": [(f, 10) for f in range(0, 100, 10)] if scope == "local" else None}
    for rank in range(3):
        whole = rank_indices(100, mode, 5, 2, rank, 3, **kw)
        for k in (0, 1, 16, len(whole)):
            assert rank_indices(100, mode, 5, 2, rank, 3, start=k, **kw).tolist() == \
                whole[k:].tolist()
        with pytest.raises(ConfigError, match="start="):
            rank_indices(100, mode, 5, 2, rank, 3, start=len(whole) + 1, **kw)


@pytest.mark.parametrize("workers, worker_type", [(0, "process"), (2, "process"),
                                                  (2, "thread")])
def test_each_rank_starts_at_its_own_batch(storage, workers, worker_type) -> None:
    """Two ranks (in one process, by rank number), a real HDF5 loader each: epoch 1 from
    step 2 delivers each rank's own batches 3.. of the whole epoch, the earlier ones' samples
    never read (the payload is the delivered batches'); the next epoch is whole again."""
    from iobench.loaders import LoaderConfig, make_loader

    (root,) = storage.glob("cifar10-*")
    config = LoaderConfig(batch_size=16, workers=workers, worker_type=worker_type)
    for rank in range(2):
        with make_loader("hdf5", root, config, rank, 2) as ld:
            ld.start()
            whole = [(b.indices.tolist(), b.payload_bytes) for b in ld.epoch(1)]
            assert len(whole) == 4
            tail = [(b.indices.tolist(), b.payload_bytes) for b in ld.epoch(1, start_step=2)]
            assert tail == whole[2:]
            assert [b.indices.tolist() for b in ld.epoch(2)] == [
                ld.indices(2)[s:s + 16].tolist() for s in range(0, 64, 16)]
            assert list(ld.epoch(1, start_step=4)) == []
