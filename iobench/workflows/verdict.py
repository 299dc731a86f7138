"""The answer a run ends with: did the storage keep the accelerator busy, what held it back, what to do.

`judge(result, probe=None, break_even=None)` reads a typed training result
(and, when there is one, a probe of the tier it read and a staging pairing)
and returns a `Verdict` record (`status, au, threshold, bottleneck, evidence,
advice, line, stragglers`); `verdict(doc, ...)` is the same as the document
`summary.verdict` holds. `line` is the one line `iobench train` ends with
(docs/metrics.md, "Verdict").

Status: `keeps up` when the median AU over repetitions is at or above the
threshold (MLPerf Storage's 0.90 by default), else `starved`. The bottleneck
of a starved run comes from where the loader's time went (the readers' clocks
in each batch: reading, decoding, and how busy the workers were):

- `storage`: the readers were busy most of the epoch, mostly reading;
- `cpu`: the readers were busy most of the epoch, mostly decoding and
  preprocessing;
- `loader`: the readers were idle much of the time while the step waited:
  too few workers in flight, or batches cost more to hand over than to make;
- `unknown`: the loader kept no clocks and no ceilings were measured (no
  evidence to blame anything).

DALI keeps no clocks of ours; its cause comes from the ceilings `train`
measures after a DALI run's epochs (`iobench.workflows.ceilings`): `storage`,
`cpu` (`decode` for a GPU pipeline), `loader`, or `startup` when most of the
stall was each epoch's first batch.

A real model that trained on the CPU gets status `no accelerator`: it
measured the CPU, and the verdict gives the command that asks the storage
question (`storage_command`). When more workers could change a starved run's
answer, the advice says so with `iobench diagnose` and the run's own
arguments (`diagnose_command`).

Whatever the class, a starved run's evidence names a worker much slower than
its rank's others (`worker_imbalance`: busy time per batch over 1.5x the
median), since batches are handed over in order and one slow worker holds
up the step.

A run that keeps up is compute-bound (`none`), and the verdict says how much
faster an accelerator the loader could still feed.

On several nodes the verdict also names stragglers (`stragglers`): nodes whose
stall, summed over the run's epochs, is over 1.5x the median node's
(`STRAGGLER_FACTOR`) and at least 1 % of the run's wall time above it, so that
noise on a run with almost no stall names nobody.
"""

from __future__ import annotations

import math
import os
import shlex
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from iobench.core.breakeven import outcome
from iobench.core.result_types import (
    Ceilings,
    CheckpointResume,
    ProbeDoc,
    Straggler,
    TrainResult,
    Verdict,
)

DEFAULT_THRESHOLD = 0.90  # MLPerf Storage: AU below 0.90 means storage cannot keep up
BUSY_SATURATED = 0.75  # readers busy at least this fraction of the epoch: they set the pace
READ_DOMINANT = 0.5  # fraction of busy time spent reading that makes storage the suspect
LIMIT_KEY = "sample_read_MBps"  # the probe figure a shuffled loader is compared with
SHARED_KINDS = ("parallel", "network", "fuse", "fuse-network", "other")
STRAGGLER_FACTOR = 1.5  # a node stalled over this many times the median node is a straggler
STRAGGLER_MIN_SHARE = 0.01  # ... and by at least this fraction of the run's wall time
IMBALANCE = 1.5  # a worker taking this many times its rank's median time per batch is slow
SLOWER = 0.8  # a ceiling under this fraction of another is set by what differs between them
STARTUP_SHARE = 0.5  # a stall mostly in each epoch's first batch is the loader's start
FEW_READS = 4  # a starved run with fewer workers than this kept few reads in flight
# seconds per sample of iobench's models on one NVIDIA H200 with their input resident (bf16,
# resnet50 channels-last; docs/results.md, "The prepared GPU check on one H200"): a GPU's
# step where the run had none
GPU_SAMPLE_S = {"resnet50": 34.7e-3 / 128, "cosmoflow": 11.6e-3 / 4, "cnn": 3.46e-3 / 64}
GPU_SAMPLE_SOURCE = "one NVIDIA H200, docs/results.md"


def parse_threshold(value: float) -> float:
    """Validate `--au-threshold`: a fraction in (0, 1]."""
    from iobench.core.errors import ConfigError

    if not (0 < value <= 1 and math.isfinite(value)):
        raise ConfigError(f"--au-threshold {value} must be a fraction in (0, 1], e.g. 0.90 "
                          "(MLPerf Storage's)")
    return value


def _real(path: str | None) -> str:
    return os.path.realpath(path) if path else ""


def under(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies below it (both real paths)."""
    return bool(root) and (path == root or path.startswith(root.rstrip("/") + "/"))


def probe_for(path: str | None, probes: Sequence[ProbeDoc]) -> ProbeDoc | None:
    """The newest probe of the deepest directory holding `path` (a dataset root)."""
    path = _real(path)
    best = None
    for p in probes:
        root = p.storage.path
        if under(path, root) and (best is None or len(root) > len(best.storage.path)
                                   or (len(root) == len(best.storage.path)
                                       and p.created > best.created)):
            best = p
    return best


def probe_limit(probe: ProbeDoc, sample_bytes: float | None) -> float | None:
    """The probe's random-read MB/s at the sample size nearest the run's (log scale)."""
    reads = [r for r in probe.summary.sample_reads if r.MBps]
    if not reads or not sample_bytes:
        return probe.summary.sample_read_MBps
    return min(reads, key=lambda r: abs(math.log(r.sample_bytes / sample_bytes))).MBps


@dataclass(frozen=True)
class LoaderTime:
    """Where the loader's time went over a run (seconds; see `loader_time`)."""

    read_s: float
    decode_s: float
    handoff_s: float
    batches: int
    busy_fraction: float
    busy_of_stall: float | None
    read_share: float | None
    handoff_share: float | None
    samples: int = 0


def loader_time(doc: TrainResult) -> LoaderTime | None:
    """Where the loader's time went, summed over every epoch and rank that has clocks.

    `busy_fraction` is the readers' busy time over the time they had (workers
    per rank, or the main process with 0 workers, times the epoch wall);
    `read_share` the part of busy time spent reading from storage.
    """
    read = decode = handoff = stall = capacity = 0.0
    batches = samples = 0
    for ep in doc.epochs:
        for r in ep.ranks:
            lt = r.loader
            if not lt:
                continue
            read += lt.read_s
            decode += lt.decode_s
            handoff += lt.handoff_s
            stall += r.stall_s
            batches += lt.batches
            samples += r.samples
            capacity += max(1, lt.workers) * ep.summary.wall_s
    busy = read + decode
    if not batches or capacity <= 0:
        return None
    return LoaderTime(read_s=read, decode_s=decode, handoff_s=handoff, batches=batches,
                      busy_fraction=busy / capacity, busy_of_stall=busy / stall if stall else None,
                      read_share=read / busy if busy > 0 else None,
                      handoff_share=handoff / stall if stall > 0 else None, samples=samples)


def _per_sample_files(fmt: str | None) -> bool:
    """Whether format `fmt` stores one file per sample (False for unknown formats)."""
    from iobench.core.formats import FORMATS

    spec = FORMATS.get(fmt or "")
    return spec is not None and spec.per_sample_files


def node_stalls(doc: TrainResult) -> list[dict[str, Any]]:
    """Each node's stall (its slowest rank's) summed over the run's epochs, from
    `epochs[i].per_node` (v3 results; empty for older ones or one node)."""
    nodes: dict[int, dict[str, Any]] = {}
    for ep in doc.epochs:
        for n in ep.per_node:
            d = nodes.setdefault(n.node, {"node": n.node, "name": n.name,
                                          "stall_s": 0.0, "wall_s": 0.0, "samples": 0})
            d["stall_s"] += n.stall_s
            d["wall_s"] += n.wall_s
            d["samples"] += n.samples
    return [nodes[k] for k in sorted(nodes)] if len(nodes) > 1 else []


def stragglers(doc: TrainResult) -> list[dict[str, Any]]:
    """Nodes whose total stall is over `STRAGGLER_FACTOR` x the median node's (and at least
    `STRAGGLER_MIN_SHARE` of the run's wall time above it), slowest first; each with
    `name`, `stall_s`, `median_stall_s` and `factor` (None when the median is 0)."""
    nodes = node_stalls(doc)
    if not nodes:
        return []
    median = statistics.median(n["stall_s"] for n in nodes)
    wall = sum(e.summary.wall_s for e in doc.epochs)
    out = [{"node": n["node"], "name": n["name"], "stall_s": n["stall_s"],
            "median_stall_s": median, "factor": n["stall_s"] / median if median > 0 else None}
           for n in nodes if n["stall_s"] > STRAGGLER_FACTOR * median
           and n["stall_s"] - median >= STRAGGLER_MIN_SHARE * wall]
    return sorted(out, key=lambda s: -s["stall_s"])


def straggler_words(slow: Sequence[Mapping[str, Any]]) -> str:
    """`straggler node(s): n2 (stall 3.1 s, 2.4x the median node's 1.3 s)`."""
    return "straggler node(s): " + ", ".join(
        f"{s['name']} (stall {s['stall_s']:.3g} s, "
        + (f"{s['factor']:.1f}x" if s["factor"] is not None else "vs")
        + f" the median node's {s['median_stall_s']:.3g} s)" for s in slow)


def worker_imbalance(doc: TrainResult, factor: float = IMBALANCE) -> list[dict[str, Any]]:
    """The workers much slower than their rank's others: busy time per batch (reading +
    decoding, summed over the epochs) above `factor` x the median of that rank's workers.

    Per batch, so a worker that made fewer batches (the end of an epoch) is not taken
    for a slow one. Needs two or more workers on a rank; slowest first.
    """
    per: dict[int, dict[int, list[float]]] = {}  # rank -> worker -> [busy_s, batches]
    for ep in doc.epochs:
        for r in ep.ranks:
            for clock in r.loader.per_worker if r.loader else ():
                if clock.worker < 0 or not clock.batches:
                    continue
                acc = per.setdefault(r.rank, {}).setdefault(clock.worker, [0.0, 0])
                acc[0] += clock.read_s + clock.decode_s
                acc[1] += clock.batches
    out = []
    for rank, workers in sorted(per.items()):
        if len(workers) < 2:
            continue
        times = {w: busy / n for w, (busy, n) in workers.items()}
        med = statistics.median(times.values())
        for w, t in times.items():
            if med > 0 and t > factor * med:
                out.append({"rank": rank, "worker": w, "per_batch_s": t,
                            "median_per_batch_s": med, "ratio": t / med})
    return sorted(out, key=lambda d: -d["ratio"])


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


@dataclass
class _Case:
    """What the verdict on one run is built from, and the sentences it gathers."""

    doc: TrainResult
    threshold: float
    au: float
    lt: LoaderTime | None
    workers: int
    cores: int
    free_cores: int
    slow: list[dict[str, Any]]
    dali_gpu: float | None = None  # samples/s DALI decoded on this node's GPU, if measured
    evidence: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)


def _spread_median(doc: TrainResult, figure: str) -> float | None:
    s = doc.summary.spread.get(figure) if doc.summary.spread else None
    return s.median if s else None


def verdict(doc: TrainResult | Mapping[str, Any], threshold: float = DEFAULT_THRESHOLD,
            probe: ProbeDoc | Mapping[str, Any] | None = None,
            break_even: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The verdict on one training result as a result document holds it (`summary.verdict`)."""
    return judge(TrainResult.of(doc), threshold,
                 None if probe is None else ProbeDoc.of(probe), break_even).to_dict()


def judge(res: TrainResult, threshold: float = DEFAULT_THRESHOLD, probe: ProbeDoc | None = None,
          break_even: Mapping[str, Any] | None = None,
          dali_gpu: float | None = None) -> Verdict:
    """The verdict on one training result (see the module docstring); `dali_gpu` is the
    samples/s DALI decoded on this node's GPU in another run, when there is one. A run that
    checkpointed (`train --checkpoint-every`) also gets `checkpoint_words`."""
    v = _judge_ingest(res, threshold, probe, break_even, dali_gpu)
    evidence, advice = checkpoint_words(res)
    if not evidence and not advice:
        return v
    return replace(v, evidence=v.evidence + tuple(evidence), advice=v.advice + tuple(advice),
                   line="; ".join([v.line, *evidence, *advice]))


def checkpoint_words(res: TrainResult) -> tuple[list[str], list[str]]:
    """(evidence, advice) on a run's checkpoints: what a save cost the steps (the median
    time it blocked them) and the share of training time checkpoints took; with --mtbf,
    Young/Daly's interval sqrt(2 x cost x MTBF) in steps and seconds, and the time lost per
    day at it and at the interval used (docs/metrics.md, "Checkpoints in training")."""
    c = res.checkpoint
    resumed = [resumed_words(c.resumed)] if c is not None and c.resumed is not None else []
    if c is None or not c.saves or c.summary.cost_s is None:
        return resumed, []
    s = c.summary
    every = f"every {s.interval_steps:,} steps" + (
        f" ({s.interval_s:.3g} s)" if s.interval_s is not None else "")
    with_it = _median([e.checkpoint.au_with_checkpoint_mean for e in res.epochs
                       if e.checkpoint is not None])
    data_only = _median([e.summary.au_mean for e in res.epochs])
    evidence = [*resumed, f"checkpoints ({c.mode}, {every}): {s.cost_s:.3g} s of blocked steps per "
                f"save, {s.fraction or 0:.1%} of training time"
                + (f" (AU {with_it:.2f} with the checkpoints' time, {data_only:.2f} with the "
                   "data stall alone)" if with_it is not None and data_only is not None
                   else "")]
    y = s.young
    if y is None or y.lost_per_day_used_s is None:
        return evidence, []
    return evidence, [
        f"with an MTBF of {y.mtbf_s / 3600:g} h, Young/Daly's interval is every "
        f"{y.optimal_steps:,} steps ({y.optimal_s:,.3g} s): about {y.lost_per_day_s:,.0f} s "
        f"lost per day, against {y.lost_per_day_used_s:,.0f} s every {y.used_steps:,} steps "
        "(checkpoints and lost work; the restart is not counted)"]


def resumed_words(r: CheckpointResume) -> str:
    """"resumed from step 8 (epoch 2, 4 of its steps done) of PATH: ..." (`train --resume`)."""
    return (f"resumed from step {r.step:,} (epoch {r.epoch + 1}, {r.epoch_step:,} of its steps "
            f"done) of {r.path}: the figures are this run's steps alone")


def _judge_ingest(res: TrainResult, threshold: float, probe: ProbeDoc | None,
                  break_even: Mapping[str, Any] | None, dali_gpu: float | None) -> Verdict:
    """The verdict on a run's ingest (`judge` without the checkpoints)."""
    au = _spread_median(res, "au")
    if au is None:
        au = _median([e.summary.au_mean for e in res.epochs])
    if au is None:
        return _done("unknown", None, threshold, "unknown", ["no epoch was measured"],
                     ["run at least one epoch"])
    workers = res.config.workers
    cores = res.provenance.cpu_affinity or os.cpu_count() or 1
    case = _Case(doc=res, threshold=threshold, au=au, lt=loader_time(res), workers=workers,
                 cores=cores, free_cores=cores - (res.world.local_size or 1) * (workers + 1),
                 slow=stragglers(res), dali_gpu=dali_gpu)
    if res.compute.kind == "none":
        return _ingest(case)
    if _model_on_cpu(res):
        return _cpu_model(case)
    if au >= threshold:
        return _keeps_up(case)
    case.evidence.append(f"AU {au_words(au, threshold, '<')}" + (
        f", stall {stall:.0%} of the epoch"
        if (stall := _spread_median(res, "stall_fraction")) is not None else ""))
    if (needs := demand_words(res)) is not None:
        case.evidence.append(needs)
    if case.slow:
        case.evidence.append(straggler_words(case.slow))
        case.advice.append(f"the slowest node sets the pace: look at {case.slow[0]['name']} "
                           "first (its storage mount, network link, or other jobs sharing it)")
    bottleneck = _classify(case)
    if bottleneck == "storage":
        limit = None
        if probe is not None:
            limit = probe_limit(probe, res.dataset.sample_bytes)
        _advise_storage(case, limit, break_even)
    elif bottleneck == "cpu":
        _advise_cpu(case)
    elif bottleneck == "loader":
        _advise_loader(case)
    _settle(case, bottleneck)
    _imbalance(case)
    return _done("starved", au, threshold, bottleneck, case.evidence, case.advice, case.slow)


def demand_words(res: TrainResult) -> str | None:
    """What the accelerator asks against what the loader gave: "resnet50 (batch 128, bf16)
    on this NVIDIA H200 needs 3,700 samples/s; the loader delivered 2,471", from the model's
    measured compute-only rate (`compute.demand`, per rank, times the ranks)."""
    c = res.compute
    delivered = _spread_median(res, "samples_per_s")
    if c.demand is None or delivered is None:
        return None
    where = c.device.name if c.device is not None and c.device.name else c.demand.device
    needs = c.demand.samples_per_s * res.world.size
    return (f"{c.model} (batch {c.demand.batch_size}{', bf16' if c.amp else ''}) on this "
            f"{where} needs {rate_words(needs)} samples/s ({c.demand.ms_per_step:.1f} ms a step with "
            f"its input on the device); the loader delivered {rate_words(delivered)}")


def rate_words(rate: float) -> str:
    """A rate as people read it: `2,471` from 100 up, three significant digits below
    (`0.131`, `12.5`), so a slow rate never prints as `0`."""
    return f"{rate:,.0f}" if abs(rate) >= 100 else f"{rate:.3g}"


def au_words(au: float, threshold: float, op: str) -> str:
    """`0.62 < 0.90`, with as many digits as it takes for the two to differ in print
    (0.898 against 0.90 is `0.898 < 0.900`, never `0.90 < 0.90`)."""
    digits = 2
    while digits < 6 and au != threshold and f"{au:.{digits}f}" == f"{threshold:.{digits}f}":
        digits += 1
    return f"{au:.{digits}f} {op} {threshold:.{digits}f}"


def _ingest(case: _Case) -> Verdict:
    """`--model none`: pure ingest, with no accelerator to starve; its rate is the answer."""
    doc = case.doc
    rate, mbps = _spread_median(doc, "samples_per_s"), _spread_median(doc, "read_MBps")
    case.evidence.append("no accelerator (--model none), so AU does not apply"
                         + (f"; the loader delivered {rate_words(rate)} samples/s"
                            if rate is not None else "")
                         + (f", {mbps:,.0f} MB/s" if mbps is not None else ""))
    if case.lt:
        case.evidence.append(f"the readers were busy {case.lt.busy_fraction:.0%} of the epoch")
    case.advice.append("to ask whether this feeds an accelerator, give its step time "
                       "(--compute-time SECONDS), a real model, or run `iobench diagnose`")
    return _done("ingest", case.au, case.threshold, "none", case.evidence, case.advice,
                 case.slow)


def _keeps_up(case: _Case) -> Verdict:
    """The verdict on a run at or above the threshold: compute-bound."""
    doc = case.doc
    case.evidence.append(f"AU {au_words(case.au, case.threshold, '>=')}")
    if (needs := demand_words(doc)) is not None:
        case.evidence.append(needs)
    if case.slow:
        case.evidence.append(straggler_words(case.slow))
    if case.lt:
        case.evidence.append(f"the readers were busy {case.lt.busy_fraction:.0%} of the epoch")
    case.advice.append("compute-bound: to find where ingest stops keeping up, rerun with a "
                       "shorter --compute-time (a faster accelerator)")
    return _done("keeps up", case.au, case.threshold, "none", case.evidence, case.advice,
                 case.slow)


def _classify(case: _Case) -> str:
    """The bottleneck of a starved run, from where the loader's time went; adds the evidence."""
    doc, lt, workers = case.doc, case.lt, case.workers
    if lt is None and doc.ceilings is not None and _measured(doc.ceilings):
        return _by_ceilings(case, doc.ceilings)
    if lt is None and doc.config.loader == "dali":
        # a result from before DALI's ceilings were measured
        # DALI reads and decodes inside its own executor: no clock of ours runs there, and
        # its API reports memory, not time per operator, so there is nothing honest to split
        from iobench.core.formats import DEFAULT_FORMAT

        fmt = doc.dataset.format or DEFAULT_FORMAT
        case.evidence.append("DALI reads and decodes inside its own pipeline, which keeps no "
                             "per-batch clocks iobench can read, so the stall cannot be split "
                             "between storage and decoding")
        alone = "--no-decode" + ("" if doc.compute.kind == "none" else " --model none")
        case.advice.append(f"to find out, rerun with {alone} (storage alone: "
                           "still starved means storage is the limit) and with --loader "
                           f"{fmt} (the PyTorch loader, whose readers keep clocks), or compare "
                           f"both with `iobench bench-read --loaders {fmt},dali`")
        return "unknown"
    if lt is None:
        case.evidence.append("the loader kept no per-batch clocks, so the time cannot be split "
                             "between storage and decoding")
        case.advice.append("compare with `iobench train --no-decode --model none` (storage "
                           "alone) and `iobench bench-read` to tell storage from decoding")
        return "unknown"
    if lt.busy_fraction >= BUSY_SATURATED or (
            workers == 0 and (lt.busy_of_stall or 0) >= BUSY_SATURATED):
        share = lt.read_share or 0.0
        if workers == 0:
            case.evidence.append(f"with 0 workers the step itself reads: reading and decoding "
                                 f"were {lt.busy_of_stall:.0%} of the stall, {share:.0%} of it "
                                 f"reading from storage and {1 - share:.0%} decoding")
            if case.free_cores > 0:
                case.advice.append("use --workers N so that reading overlaps the step "
                                   f"({case.free_cores} core(s) free)")
        else:
            case.evidence.append(f"the readers were busy {lt.busy_fraction:.0%} of the epoch, "
                                 f"{share:.0%} of it reading from storage and {1 - share:.0%} "
                                 "decoding")
        return "storage" if share >= READ_DOMINANT else "cpu"
    case.evidence.append(f"the readers were busy only {lt.busy_fraction:.0%} of the epoch "
                         "while the step waited")
    if lt.handoff_share is not None:
        case.evidence.append(f"{lt.handoff_share:.0%} of the stall was batches already "
                             "made, waiting to be handed over (queues, unpickling, copies)")
    return "loader"


def _advise_storage(case: _Case, limit: float | None,
                    break_even: Mapping[str, Any] | None) -> None:
    doc, free = case.doc, case.free_cores
    mbps = _spread_median(doc, "read_MBps")
    storage = doc.provenance.storage
    if mbps is not None:
        tier = f"{storage.fstype} ({storage.kind})" if storage.fstype else "this tier"
        read = f"reads at {mbps:.0f} MB/s" if mbps >= 10 else f"reads at {mbps:.3g} MB/s"
        if limit:
            read += f" = {mbps / limit:.2f} of {tier}'s probed limit ({limit:.0f} MB/s)"
        case.evidence.append(read)
    what = None if break_even is None else outcome(break_even)
    if what == "never":
        case.advice.append("staging to node-local storage never pays off here")
    elif what == "pays off":
        assert break_even is not None
        case.advice.append("staging to node-local storage pays off after "
                           f"{break_even['break_even_epochs']:.1f} epochs")
    elif what == "not significant":  # within the spread: no number that would mislead
        case.advice.append("staging's gain here is within the runs' spread (not significant): "
                           "repeat both runs (--repeat 3) to tell")
    elif storage.kind in SHARED_KINDS:
        case.advice.append("stage the dataset to node-local storage (iobench train --stage-to "
                           "DIR) and compare the two runs for the break-even")
    if _per_sample_files(doc.dataset.format):
        case.advice.append("many small files: a record format (HDF5, LMDB, Zarr) reads them "
                           "in larger requests")
    if 0 < case.workers < 4 and free > 0:
        case.advice.append(f"more --workers keep more reads in flight ({free} core(s) free)")


def _advise_cpu(case: _Case) -> None:
    if (gpu := _gpu_decode_words(case)) is not None:
        case.advice.append(gpu)
    if case.free_cores > 0 and case.workers > 0:
        case.advice.append(f"more --workers: {case.free_cores} core(s) are free")
    elif case.doc.config.loader == "dali":
        case.advice.append(f"the {case.cores} core(s) are all in use and DALI decodes on "
                           "them here: on a GPU node train runs DALI's decoding on the GPU; "
                           "or lighter preprocessing")
    else:
        case.advice.append(f"the {case.cores} core(s) are all in use: decode on the GPU with "
                           "DALI (--loader dali, on a GPU node), or lighter preprocessing")
    if case.doc.dataset.dataset == "imagenet":
        case.advice.append("JPEG decoding dominates: DALI's nvJPEG decodes on the GPU")


def _advise_loader(case: _Case) -> None:
    handoff = case.lt is not None and (case.lt.handoff_share or 0) >= 0.5
    if handoff and case.workers > 0 and case.doc.config.worker_type == "process":
        case.advice.append("batches cost more to move between processes than to make: try "
                           "--worker-type thread (no copy between processes)")
    else:
        case.advice.append("more --workers (or prefetch) keep batches in flight"
                           + (f" ({case.free_cores} core(s) free)" if case.free_cores > 0
                              else ""))


def _imbalance(case: _Case) -> None:
    slow_workers = worker_imbalance(case.doc)
    if not slow_workers:
        return
    s = slow_workers[0]
    more = f" (and {len(slow_workers) - 1} more)" if len(slow_workers) > 1 else ""
    case.evidence.append(f"imbalance: worker {s['worker']} of rank {s['rank']} took "
                         f"{s['ratio']:.1f}x its rank's median time per batch "
                         f"({s['per_batch_s'] * 1e3:.0f} ms vs "
                         f"{s['median_per_batch_s'] * 1e3:.0f} ms){more}")
    case.advice.append("batches are handed over in order, so a slow worker holds up the "
                       "rest: look at what it reads (files on a slower disk or server, larger "
                       "samples) or at what else runs on its core")


def _measured(c: Ceilings) -> bool:
    return min(c.cold_fetch_samples_per_s, c.warm_fetch_samples_per_s,
               c.warm_decode_samples_per_s) > 0


def _by_ceilings(case: _Case, c: Ceilings) -> str:
    """The cause of a starved run whose loader kept no clocks (DALI), from its ceilings
    measured after the epochs: the lowest of fetching cold, handing over, and decoding."""
    cold, warm, dec = (c.cold_fetch_samples_per_s, c.warm_fetch_samples_per_s,
                       c.warm_decode_samples_per_s)
    case.evidence.append(
        f"DALI keeps no per-batch clocks, so iobench measured its ceilings after the epochs "
        f"({c.batches} batches a pass, {c.threads} thread(s), operators on the "
        f"{c.device.upper()}): {rate_words(cold)} samples/s {'cold' if c.cold else 'warm'} without "
        f"decoding ({c.cold_fetch_MBps:,.0f} MB/s), {rate_words(warm)} in memory without decoding, "
        f"{rate_words(dec)} in memory decoding")
    if _startup(case):
        return "startup"
    if c.cold and cold < SLOWER * warm and cold <= dec:
        case.evidence.append(f"fetching cold is {warm / cold:.1f}x slower than from memory "
                             "and under the decoding ceiling: storage sets the pace")
        return "storage"
    if dec < SLOWER * warm:
        per = dec / max(1, min(c.threads, case.cores))
        case.evidence.append(f"decoding costs {warm / dec:.1f}x the hand-over alone "
                             f"({rate_words(per)} samples/s per thread): decoding sets the pace")
        return "cpu" if c.device == "cpu" else "decode"
    case.evidence.append("neither fetching cold nor decoding slows DALI much by itself: its "
                         "pipeline's own rate (threads, hand-over to the step) sets the pace")
    return "loader"


def _startup(case: _Case) -> bool:
    """Whether most of the stall was each epoch's first batch (the slowest rank's): the
    loader's start, not its rate once running; adds the evidence and advice."""
    epochs = case.doc.epochs
    first = sum(e.summary.first_batch_s_max or 0.0 for e in epochs)
    stall = sum(e.summary.stall_s_max for e in epochs)
    if stall <= 0 or first < STARTUP_SHARE * stall:
        return False
    case.evidence.append(f"{first / stall:.0%} of the stall was each epoch's first batch "
                         f"({first:.3g} s over {len(epochs)} epoch(s)): the pipeline's start "
                         "(threads, Python workers, first reads), not its rate once running")
    case.advice.append("the start is paid once an epoch: longer epochs (no --max-steps) "
                       "amortise it; if it stays large, look at what starts before the first "
                       "batch (worker start-up, file opens)")
    return True


def _gpu_with_dali(doc: TrainResult) -> bool:
    """Whether the run's node has a GPU (the model ran on one, or one was found) and DALI."""
    device = doc.compute.device
    gpu = (device is not None and device.type == "cuda") or bool(doc.provenance.gpus)
    versions = doc.provenance.versions or {}
    return gpu and bool(versions.get("nvidia-dali"))


def _decode_per_core(case: _Case) -> float | None:
    """Samples one core decodes a second: from the readers' clocks (samples over decode
    time, summed over workers), or a CPU DALI pipeline's in-memory ceiling per thread."""
    c = case.doc.ceilings
    if case.lt is not None and case.lt.decode_s > 0 and case.lt.samples:
        return case.lt.samples / case.lt.decode_s
    if c is not None and c.device == "cpu" and _measured(c):
        return c.warm_decode_samples_per_s / max(1, min(c.threads, case.cores))
    return None


def _gpu_decode_words(case: _Case) -> str | None:
    """When CPU decoding is the limit on a node with a GPU and DALI: the figures that say
    whether decoding on the GPU would feed it."""
    doc = case.doc
    per_core = _decode_per_core(case)
    if not _gpu_with_dali(doc) or per_core is None:
        return None
    fmt = doc.config.format or doc.dataset.format
    gpu = (f"DALI decoded {rate_words(case.dali_gpu)} samples/s on this node's GPU"
           if case.dali_gpu else "DALI's GPU rate here is not measured yet")
    return (f"CPU decoding is the limit and this node has a GPU with DALI: a core decodes "
            f"{rate_words(per_core)} samples/s, so the {case.cores} core(s) available reach at most "
            f"{rate_words(per_core * case.cores)}; {gpu}: decode on the GPU with --loader dali"
            + (f" --format {fmt}" if fmt else "") + " (train runs DALI's decoding on the GPU "
            "when it trains on one)")


def _model_on_cpu(res: TrainResult) -> bool:
    device = res.compute.device
    return res.compute.kind == "model" and device is not None and device.type == "cpu"


def _dataset_args(doc: TrainResult) -> list[str]:
    """The options that name the run's dataset and reader, as train and diagnose take them."""
    c = doc.config
    if c.data is not None:
        args = ["--data", c.data]
        args += ["--data-key", c.data_key] if c.data_key else []
        args += ["--label-key", c.label_key] if c.label_key else []
        return args + (["--loader", "dali"] if c.loader == "dali" else [])
    args = ["--loader", c.loader, "--storage", c.storage, "--dataset", c.dataset]
    return args + (["--format", c.format] if c.format else [])


def storage_command(doc: TrainResult) -> str:
    """The run again with a GPU's step emulated: what asks whether the storage feeds a GPU
    (the step from `GPU_SAMPLE_S` where iobench measured the model on one)."""
    c = doc.config
    model = doc.compute.model or ""
    args = ["iobench", "train", *_dataset_args(doc), "--workers", str(c.workers),
            "--batch-size", str(c.batch_size), "--epochs", str(c.epochs)]
    args += ["--evict-cmd", c.evict_cmd] if c.evict_cmd else []
    per = GPU_SAMPLE_S.get(model)
    if per is not None:
        return (f"`{shlex.join([*args, '--compute-time', f'{per * c.batch_size:.3g}'])}` "
                f"({model} takes {per * c.batch_size:.3g} s a step of {c.batch_size} on "
                f"{GPU_SAMPLE_SOURCE}), or your GPU's own step time")
    return (f"`{shlex.join(args)} --compute-time SECONDS` (your GPU's step time for batch "
            f"{c.batch_size}), or an MLPerf workload: `iobench train --workload resnet50 "
            "--accelerator h100 --storage DIR`")


def _cpu_model(case: _Case) -> Verdict:
    """A real model trained on the CPU: it measures the CPU, so no storage verdict."""
    doc = case.doc
    rate = _spread_median(doc, "samples_per_s")
    case.evidence.append("the model ran on the CPU"
                         + (f" at {rate_words(rate)} samples/s" if rate is not None else "")
                         + ": this measures the CPU, not the storage")
    if (needs := demand_words(doc)) is not None:
        case.evidence.append(needs)
    case.evidence.append(f"AU {case.au:.2f}, of the CPU")
    if case.slow:
        case.evidence.append(straggler_words(case.slow))
    case.advice.append("to ask whether the storage feeds a GPU, emulate its step: "
                       + storage_command(doc))
    return _done("no accelerator", case.au, case.threshold, "none", case.evidence,
                 case.advice, case.slow)


def diagnose_command(doc: TrainResult) -> str:
    """`iobench diagnose` with the run's own dataset, batch, workers and demand."""
    c, comp = doc.config, doc.compute
    args = ["iobench", "diagnose", *_dataset_args(doc), "--batch-size", str(c.batch_size),
            "--workers", str(c.workers)]
    if comp.kind == "emulated" and c.compute_time_s is not None:
        args += ["--compute-time", f"{c.compute_time_s:g}"]
    elif comp.demand is not None:
        args += ["--demand", f"{comp.demand.samples_per_s:.4g}"]
    args += ["--shuffle", c.shuffle] if c.shuffle != "global" else []
    args += ["--seed", str(c.seed)] if c.seed else []
    args += ["--worker-type", c.worker_type] if c.worker_type not in (None, "process") else []
    args += ["--no-decode"] if c.decode is False else []
    args += ["--evict-cmd", c.evict_cmd] if c.evict_cmd else []
    return shlex.join(args) + ("" if "--compute-time" in args or "--demand" in args
                               else " --compute-time SECONDS")


def _settle(case: _Case, bottleneck: str) -> None:
    """One sentence when the answer could change with another setting (the workers, and so
    the reads in flight), and the diagnosis that settles it."""
    w, free = case.workers, case.free_cores
    if bottleneck in ("loader", "cpu") and free > 0:
        why = (f"with {w} worker(s) and {free} core(s) free, more workers may lift the "
               "loader's ceiling until storage sets the pace")
    elif bottleneck == "storage" and w < FEW_READS:
        why = (f"{w} worker(s) kept few reads in flight, and more may fetch faster, or show "
               "that the loader is the limit")
    else:
        return
    case.advice.append(f"this answer may change with --workers ({why}): to tell staging from "
                       f"tuning, run `{diagnose_command(case.doc)}`")


_STATUS_WORDS = {"storage": "starved by storage", "cpu": "starved by the CPU (decoding)",
                 "decode": "starved by decoding", "loader": "starved by the loader",
                 "startup": "starved by the loader's start-up",
                 "unknown": "starved (cause unknown)"}


def _done(status: str, au: float | None, threshold: float, bottleneck: str,
          evidence: list[str], advice: list[str],
          slow: Sequence[Mapping[str, Any]] = ()) -> Verdict:
    head = ({"keeps up": "keeps up", "ingest": "pure ingest",
             "no accelerator": "no accelerator"}.get(status)
            or _STATUS_WORDS.get(bottleneck, status))
    line = f"verdict: {head} - " + "; ".join(evidence + advice)
    return Verdict(status=status, au=au, threshold=threshold, bottleneck=bottleneck,
                   evidence=tuple(evidence), advice=tuple(advice), line=line,
                   stragglers=tuple(Straggler(**s) for s in slow))


def for_run(doc: TrainResult | Mapping[str, Any], results_dir: str,
            threshold: float) -> dict[str, Any]:
    """The verdict on a run just measured, with what the results directory adds: the
    newest probe of the tier it read, and a staging pairing with a run on the other tier."""
    from iobench.core.breakeven import staging_pairs
    from iobench.core.jsonio import read_json
    from iobench.core.results import (
        PROBE_SCHEMA,
        PROBE_SCHEMA_VERSION,
        find_documents,
        load_typed,
        schema_of,
    )

    res = TrainResult.of(doc)
    probes: list[ProbeDoc] = []
    others: list[TrainResult] = []
    try:
        found = find_documents([results_dir])
        others = [load_typed(p) for p in found.results]
        probes = [ProbeDoc.from_dict(read_json(p, schema=PROBE_SCHEMA,
                                               max_version=PROBE_SCHEMA_VERSION), str(p))
                  for p, _ in found.skipped if schema_of(p) == PROBE_SCHEMA]
    except Exception:  # a damaged neighbour must not cost the run its verdict
        pass
    probe = probe_for(res.dataset.root, probes)
    runs = [d for d in others if d.run_id != res.run_id] + [res]
    pairs = [b for b in staging_pairs(runs) if res.run_id in (b["slow_run_id"],
                                                              b["fast_run_id"])
             and not b["refused"]]
    return judge(res, threshold, probe, pairs[-1] if pairs else None,
                 dali_gpu_rate(res, others)).to_dict()


def dali_gpu_rate(res: TrainResult, others: Sequence[TrainResult]) -> float | None:
    """The best in-memory decoding rate (samples/s) DALI reached on a GPU with this run's
    dataset, on this run's host, in any of `others` (None when no such run was measured)."""
    rates = [d.ceilings.warm_decode_samples_per_s for d in others
             if d.ceilings is not None and d.ceilings.device == "gpu"
             and d.config.loader == "dali" and d.dataset.dataset == res.dataset.dataset
             and d.provenance.host == res.provenance.host]
    return max(rates) if rates else None
