"""A clockless loader's (DALI's) split of its time, measured: short passes cold and in memory, with and without decoding."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from iobench.loaders.base import Loader
from iobench.loaders.base import batches as epoch_batches

MIN_BATCHES = 4  # a pass delivers at least this many batches (the first one's wait left out)
MIN_SECONDS = 1.0  # ... and runs at least this long, unless the epoch ends first
MAX_BATCHES = 256  # ... and at most this many batches
MAX_SECONDS = 10.0  # ... or this long, whichever comes first (a slow tier)


@dataclasses.dataclass(frozen=True)
class PassRate:
    """One pass: batches delivered, samples/s and MB/s after the first batch arrived."""

    batches: int
    samples_per_s: float
    MBps: float


def _rate(loader: Loader, batches: int | None) -> PassRate:
    """`loader`'s epoch 0 from its first batch's arrival (pipeline build and worker start
    left out; that batch's samples not counted): exactly `batches` batches, or with None
    until the pass has run `MIN_SECONDS` and `MIN_BATCHES` (at most the `MAX_*`)."""
    samples = nbytes = k = 0
    t_first = t_last = 0
    for k, batch in enumerate(epoch_batches(loader, 0), 1):
        t_last = time.perf_counter_ns()
        if k == 1:
            t_first = t_last
        else:
            samples += len(batch.indices)
            nbytes += batch.payload_bytes
        seconds = (t_last - t_first) / 1e9
        if k == batches or (batches is None and (
                (k >= MIN_BATCHES and seconds >= MIN_SECONDS)
                or k >= MAX_BATCHES or seconds >= MAX_SECONDS)):
            break
    seconds = (t_last - t_first) / 1e9
    if seconds <= 0 or samples == 0:
        return PassRate(k, 0.0, 0.0)
    return PassRate(k, samples / seconds, nbytes / seconds / 1e6)


def _pass(loader: Loader, decode: bool, batches: int | None) -> PassRate:
    """One pass with a fresh copy of `loader` (decoding or not), started, measured, closed."""
    config = dataclasses.replace(loader.config, decode=decode,
                                 max_steps=batches or MAX_BATCHES)
    variant = getattr(loader, "variant", None)  # a copy that skips checks already made
    fresh = (variant(config) if variant is not None
             else type(loader)(loader.manifest, config, loader.rank, loader.world))
    try:
        fresh.start()
        return _rate(fresh, batches)
    finally:
        fresh.close()


def measure(loader: Loader, evict: Callable[[], Any], cold: bool = True) -> dict[str, Any]:
    """Three bounded passes over epoch 0's first batches with the run's loader settings:
    cold without decoding (storage and hand-over), then the same batches in memory without
    decoding (hand-over alone) and with decoding (the pipeline's in-memory ceiling).
    `evict()` empties the cache before the cold pass (a collective: every rank calls this);
    `cold=False` (a warm-cache run) keeps it, and the first pass is warm too."""
    if cold:
        evict()
    first = _pass(loader, False, None)
    warm = _pass(loader, False, first.batches)
    decode = _pass(loader, True, first.batches)
    return {"method": "bounded passes after the epochs over epoch 0's first batches: cold "
                      "without decoding, then in memory without and with decoding",
            "batches": first.batches, "threads": max(1, loader.config.workers),
            "device": loader.config.device, "cold": cold,
            "cold_fetch_samples_per_s": first.samples_per_s, "cold_fetch_MBps": first.MBps,
            "warm_fetch_samples_per_s": warm.samples_per_s,
            "warm_decode_samples_per_s": decode.samples_per_s}
