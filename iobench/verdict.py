"""The answer a run ends with: did the storage keep the accelerator busy, what held it back, what to do.

`verdict(doc, probe=None, staging=None)` reads a training result (and, when
there is one, a probe of the tier it read and a staging pairing) and returns
`{status, au, threshold, bottleneck, evidence, advice, line}`; `line` is the
one line `iobench train` ends with (docs/metrics.md, "Verdict").

Status: `keeps up` when the median AU over repetitions is at or above the
threshold (MLPerf Storage's 0.90 by default), else `starved`. The bottleneck
of a starved run comes from where the loader's time went (the readers' clocks
in each batch: reading, decoding, and how busy the workers were):

- `storage`: the readers were busy most of the epoch, mostly reading;
- `cpu`: the readers were busy most of the epoch, mostly decoding and
  preprocessing;
- `loader`: the readers were idle much of the time while the step waited:
  too few workers in flight, or batches cost more to hand over than to make;
- `unknown`: the loader kept no clocks (no evidence to blame anything).

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
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_THRESHOLD = 0.90  # MLPerf Storage: AU below 0.90 means storage cannot keep up
BUSY_SATURATED = 0.75  # readers busy at least this fraction of the epoch: they set the pace
READ_DOMINANT = 0.5  # fraction of busy time spent reading that makes storage the suspect
LIMIT_KEY = "sample_read_MBps"  # the probe figure a shuffled loader is compared with
SHARED_KINDS = ("parallel", "network", "fuse", "fuse-network", "other")
STRAGGLER_FACTOR = 1.5  # a node stalled over this many times the median node is a straggler
STRAGGLER_MIN_SHARE = 0.01  # ... and by at least this fraction of the run's wall time
IMBALANCE = 1.5  # a worker taking this many times its rank's median time per batch is slow


def parse_threshold(value: float) -> float:
    """Validate `--au-threshold`: a fraction in (0, 1]."""
    from iobench.errors import ConfigError

    if not (0 < value <= 1 and math.isfinite(value)):
        raise ConfigError(f"--au-threshold {value} must be a fraction in (0, 1], e.g. 0.90 "
                          "(MLPerf Storage's)")
    return value


def _real(path: str | None) -> str:
    return os.path.realpath(path) if path else ""


def under(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies below it (both real paths)."""
    return bool(root) and (path == root or path.startswith(root.rstrip("/") + "/"))


def probe_for(path: str | None, probes: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest probe of the deepest directory holding `path` (a dataset root)."""
    path = _real(path)
    best = None
    for p in probes:
        root = p["storage"]["path"]
        if under(path, root) and (best is None or len(root) > len(best["storage"]["path"])
                                   or (len(root) == len(best["storage"]["path"])
                                       and p["created"] > best["created"])):
            best = p
    return best


def probe_limit(probe: Mapping[str, Any], sample_bytes: float | None) -> float | None:
    """The probe's random-read MB/s at the sample size nearest the run's (log scale)."""
    reads = [r for r in probe["summary"].get("sample_reads") or [] if r.get("MBps")]
    limit: float | None
    if not reads or not sample_bytes:
        limit = probe["summary"].get(LIMIT_KEY)
    else:
        limit = min(reads, key=lambda r: abs(math.log(r["sample_bytes"] / sample_bytes)))["MBps"]
    return limit


def loader_time(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """Where the loader's time went, summed over every epoch and rank that has clocks.

    `busy_fraction` is the readers' busy time over the time they had (workers
    per rank, or the main process with 0 workers, times the epoch wall);
    `read_share` the part of busy time spent reading from storage.
    """
    read = decode = handoff = stall = capacity = 0.0
    batches = 0
    for ep in doc["epochs"]:
        wall = ep["summary"]["wall_s"]
        for r in ep["ranks"]:
            lt = r.get("loader")
            if not lt:
                continue
            read += lt["read_s"]
            decode += lt["decode_s"]
            handoff += lt.get("handoff_s", 0.0)
            stall += r["stall_s"]
            batches += lt["batches"]
            capacity += max(1, lt["workers"]) * wall
    busy = read + decode
    if not batches or capacity <= 0:
        return None
    return {"read_s": read, "decode_s": decode, "handoff_s": handoff, "batches": batches,
            "busy_fraction": busy / capacity, "busy_of_stall": busy / stall if stall else None,
            "read_share": read / busy if busy > 0 else None,
            "handoff_share": handoff / stall if stall > 0 else None}


def _per_sample_files(fmt: str | None) -> bool:
    """Whether format `fmt` stores one file per sample (False for unknown formats)."""
    from iobench.formats import FORMATS

    spec = FORMATS.get(fmt or "")
    return spec is not None and spec.per_sample_files


def node_stalls(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each node's stall (its slowest rank's) summed over the run's epochs, from
    `epochs[i].per_node` (v3 results; empty for older ones or one node)."""
    nodes: dict[int, dict[str, Any]] = {}
    for ep in doc["epochs"]:
        for n in ep.get("per_node") or []:
            d = nodes.setdefault(n["node"], {"node": n["node"], "name": n["name"],
                                             "stall_s": 0.0, "wall_s": 0.0, "samples": 0})
            d["stall_s"] += n["stall_s"]
            d["wall_s"] += n["wall_s"]
            d["samples"] += n["samples"]
    return [nodes[k] for k in sorted(nodes)] if len(nodes) > 1 else []


def stragglers(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Nodes whose total stall is over `STRAGGLER_FACTOR` x the median node's (and at least
    `STRAGGLER_MIN_SHARE` of the run's wall time above it), slowest first; each with
    `name`, `stall_s`, `median_stall_s` and `factor` (None when the median is 0)."""
    nodes = node_stalls(doc)
    if not nodes:
        return []
    median = statistics.median(n["stall_s"] for n in nodes)
    wall = sum(e["summary"]["wall_s"] for e in doc["epochs"])
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


def worker_imbalance(doc: Mapping[str, Any], factor: float = IMBALANCE) -> list[dict[str, Any]]:
    """The workers much slower than their rank's others: busy time per batch (reading +
    decoding, summed over the epochs) above `factor` x the median of that rank's workers.

    Per batch, so a worker that made fewer batches (the end of an epoch) is not taken
    for a slow one. Needs two or more workers on a rank; slowest first.
    """
    per: dict[int, dict[int, list[float]]] = {}  # rank -> worker -> [busy_s, batches]
    for ep in doc["epochs"]:
        for i, r in enumerate(ep["ranks"]):
            for w in (r.get("loader") or {}).get("per_worker") or []:
                if w["worker"] < 0 or not w["batches"]:
                    continue
                acc = per.setdefault(r.get("rank", i), {}).setdefault(w["worker"], [0.0, 0])
                acc[0] += w["read_s"] + w["decode_s"]
                acc[1] += w["batches"]
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


def verdict(doc: Mapping[str, Any], threshold: float = DEFAULT_THRESHOLD,  # noqa: C901 - split on branch i27-results
            probe: Mapping[str, Any] | None = None,
            break_even: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The verdict on one training result (see the module docstring)."""
    spread = (doc.get("summary") or {}).get("spread") or {}
    au = (spread.get("au") or {}).get("median")
    if au is None:
        au = _median([e["summary"]["au_mean"] for e in doc["epochs"]])
    mbps = (spread.get("read_MBps") or {}).get("median")
    stall = (spread.get("stall_fraction") or {}).get("median")
    storage = (doc.get("provenance") or {}).get("storage") or {}
    kind = storage.get("kind")
    tier = f"{storage.get('fstype')} ({kind})" if storage.get("fstype") else "this tier"
    evidence: list[str] = []
    advice: list[str] = []
    if au is None:
        return _done("unknown", None, threshold, "unknown", ["no epoch was measured"],
                     ["run at least one epoch"])
    limit = None
    if probe is not None:
        nbytes = doc["dataset"].get("total_bytes")
        samples = doc["dataset"].get("num_samples")
        limit = probe_limit(probe, nbytes / samples if nbytes and samples else None)
    lt = loader_time(doc)
    workers = doc["config"].get("workers", 0)
    cores = (doc.get("provenance") or {}).get("cpu_affinity") or os.cpu_count() or 1
    ranks_per_node = (doc.get("world") or {}).get("local_size") or 1
    free_cores = cores - ranks_per_node * (workers + 1)

    slow = stragglers(doc)
    if au >= threshold:
        evidence.append(f"AU {au:.2f} >= {threshold:.2f}")
        if slow:
            evidence.append(straggler_words(slow))
        if lt:
            evidence.append(f"the readers were busy {lt['busy_fraction']:.0%} of the epoch")
        advice.append("compute-bound: to find where ingest stops keeping up, rerun with a "
                      "shorter --compute-time (a faster accelerator)")
        if doc["compute"]["kind"] == "model" and (doc["compute"].get("device") or {}).get(
                "type") == "cpu":
            advice.append("the model trained on the CPU; emulate your GPU's step with "
                          "--compute-time SECONDS to ask whether the storage feeds it")
        return _done("keeps up", au, threshold, "none", evidence, advice, slow)

    evidence.append(f"AU {au:.2f} < {threshold:.2f}" + (f", stall {stall:.0%} of the epoch"
                                                          if stall is not None else ""))
    if slow:
        evidence.append(straggler_words(slow))
        advice.append(f"the slowest node sets the pace: look at {slow[0]['name']} first (its "
                      "storage mount, network link, or other jobs sharing it)")
    if lt is None and doc["config"].get("loader") == "dali":
        # DALI reads and decodes inside its own executor: no clock of ours runs there, and
        # its API reports memory, not time per operator, so there is nothing honest to split
        bottleneck = "unknown"
        from iobench.formats import DEFAULT_FORMAT

        fmt = doc["dataset"].get("format") or DEFAULT_FORMAT
        evidence.append("DALI reads and decodes inside its own pipeline, which keeps no "
                        "per-batch clocks iobench can read, so the stall cannot be split "
                        "between storage and decoding")
        alone = "--no-decode" + ("" if doc["compute"].get("kind") == "none" else " --model none")
        advice.append(f"to find out, rerun with {alone} (storage alone: "
                      "still starved means storage is the limit) and with --loader "
                      f"{fmt} (the PyTorch loader, whose readers keep clocks), or compare "
                      f"both with `iobench bench-read --loaders {fmt},dali`")
    elif lt is None:
        bottleneck = "unknown"
        evidence.append("the loader kept no per-batch clocks, so the time cannot be split "
                        "between storage and decoding")
        advice.append("compare with `iobench train --no-decode --model none` (storage alone) "
                      "and `iobench bench-read` to tell storage from decoding")
    elif lt["busy_fraction"] >= BUSY_SATURATED or (
            workers == 0 and (lt["busy_of_stall"] or 0) >= BUSY_SATURATED):
        share = lt["read_share"] or 0.0
        if workers == 0:
            evidence.append(f"with 0 workers the step itself reads: reading and decoding were "
                            f"{lt['busy_of_stall']:.0%} of the stall, {share:.0%} of it "
                            f"reading from storage and {1 - share:.0%} decoding")
            if free_cores > 0:
                advice.append("use --workers N so that reading overlaps the step "
                              f"({free_cores} core(s) free)")
        else:
            evidence.append(f"the readers were busy {lt['busy_fraction']:.0%} of the epoch, "
                            f"{share:.0%} of it reading from storage and {1 - share:.0%} "
                            "decoding")
        bottleneck = "storage" if share >= READ_DOMINANT else "cpu"
    else:
        bottleneck = "loader"
        evidence.append(f"the readers were busy only {lt['busy_fraction']:.0%} of the epoch "
                        "while the step waited")
        if lt["handoff_share"] is not None:
            evidence.append(f"{lt['handoff_share']:.0%} of the stall was batches already "
                            "made, waiting to be handed over (queues, unpickling, copies)")
    if bottleneck == "storage":
        if mbps is not None:
            read = f"reads at {mbps:.0f} MB/s" if mbps >= 10 else f"reads at {mbps:.3g} MB/s"
            if limit:
                read += f" = {mbps / limit:.2f} of {tier}'s probed limit ({limit:.0f} MB/s)"
            evidence.append(read)
        if break_even is not None and break_even.get("break_even_epochs") is not None:
            be = break_even["break_even_epochs"]
            advice.append("staging to node-local storage never pays off here" if math.isinf(be)
                          else f"staging to node-local storage pays off after {be:.1f} epochs")
        elif kind in SHARED_KINDS:
            advice.append("stage the dataset to node-local storage (iobench train --stage-to "
                          "DIR) and compare the two runs for the break-even")
        if _per_sample_files(doc["dataset"].get("format")):
            advice.append("many small files: a record format (HDF5, LMDB, Zarr) reads them "
                          "in larger requests")
        if 0 < workers < 4 and free_cores > 0:
            advice.append(f"more --workers keep more reads in flight ({free_cores} core(s) "
                          "free)")
    elif bottleneck == "cpu":
        if free_cores > 0 and workers > 0:
            advice.append(f"more --workers: {free_cores} core(s) are free")
        else:
            advice.append(f"the {cores} core(s) are all in use: decode on the GPU with DALI "
                          "(--loader dali, on a GPU node), or lighter preprocessing")
        if doc["dataset"].get("dataset") == "imagenet":
            advice.append("JPEG decoding dominates: DALI's nvJPEG decodes on the GPU")
    elif bottleneck == "loader":
        handoff = lt is not None and (lt["handoff_share"] or 0) >= 0.5
        if handoff and workers > 0 and doc["config"].get("worker_type") == "process":
            advice.append("batches cost more to move between processes than to make: try "
                          "--worker-type thread (no copy between processes)")
        else:
            advice.append("more --workers (or prefetch) keep batches in flight"
                          + (f" ({free_cores} core(s) free)" if free_cores > 0 else ""))
    slow_workers = worker_imbalance(doc)
    if slow_workers:
        s = slow_workers[0]
        more = (f" (and {len(slow_workers) - 1} more)" if len(slow_workers) > 1
                else "")
        evidence.append(f"imbalance: worker {s['worker']} of rank {s['rank']} took "
                        f"{s['ratio']:.1f}x its rank's median time per batch "
                        f"({s['per_batch_s'] * 1e3:.0f} ms vs "
                        f"{s['median_per_batch_s'] * 1e3:.0f} ms){more}")
        advice.append("batches are handed over in order, so a slow worker holds up the "
                      "rest: look at what it reads (files on a slower disk or server, larger "
                      "samples) or at what else runs on its core")
    return _done("starved", au, threshold, bottleneck, evidence, advice, slow)


_STATUS_WORDS = {"storage": "starved by storage", "cpu": "starved by the CPU (decoding)",
                 "loader": "starved by the loader", "unknown": "starved (cause unknown)"}


def _done(status: str, au: float | None, threshold: float, bottleneck: str,
          evidence: list[str], advice: list[str],
          slow: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    head = "keeps up" if status == "keeps up" else _STATUS_WORDS.get(bottleneck, status)
    line = f"verdict: {head} - " + "; ".join(evidence + advice)
    return {"status": status, "au": au, "threshold": threshold, "bottleneck": bottleneck,
            "evidence": evidence, "advice": advice, "line": line,
            "stragglers": [dict(s) for s in slow]}


def for_run(doc: dict[str, Any], results_dir: str, threshold: float) -> dict[str, Any]:
    """The verdict on a run just measured, with what the results directory adds: the
    newest probe of the tier it read, and a staging pairing with a run on the other tier."""
    from iobench.breakeven import staging_pairs
    from iobench.jsonio import read_json
    from iobench.results import (
        PROBE_SCHEMA,
        PROBE_SCHEMA_VERSION,
        find_documents,
        load_result,
        schema_of,
    )

    probes, others = [], []
    try:
        found = find_documents([results_dir])
        others = [load_result(p) for p in found.results]
        probes = [read_json(p, schema=PROBE_SCHEMA, max_version=PROBE_SCHEMA_VERSION)
                  for p, _ in found.skipped if schema_of(p) == PROBE_SCHEMA]
    except Exception:  # a damaged neighbour must not cost the run its verdict
        pass
    probe = probe_for(doc["dataset"].get("root"), probes)
    runs = [d for d in others if d["run_id"] != doc["run_id"]] + [doc]
    pairs = [b for b in staging_pairs(runs) if doc["run_id"] in (b.get("slow_run_id"),
                                                                  b.get("fast_run_id"))
             and not b.get("refused")]
    return verdict(doc, threshold, probe, pairs[-1] if pairs else None)
