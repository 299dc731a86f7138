"""`iobench project`: the queueing model on cases with known answers, the simulation against it,
the projection fitted to a node, and the command end to end (bad inputs: one line, exit 2)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from iobench.cli import main
from iobench.core.errors import ConfigError
from iobench.core.projection import (
    BANDWIDTH,
    CLIENT,
    CPU,
    LATENCY,
    METADATA,
    REQUESTS,
    Figure,
    NodeFigures,
    ReadModel,
    StagingFigures,
    StagingModel,
    TierLimits,
    break_even_epochs,
    fetches_per_request,
    pipeline_wall,
    read_network,
    request_demand_s,
    requests_per_batch,
)
from iobench.core.queueing import (
    DELAY,
    Network,
    Station,
    bounds,
    mva_exact,
    mva_schweitzer,
    solve,
)
from iobench.core.simulation import (
    FIXED,
    Service,
    TrainingShape,
    simulate_closed,
    simulate_training,
)
from result_docs import probe_doc, real_result

# ------------------------------------------------------------------ the model's known answers


def _repairman_throughput(n: int, d: float, z: float) -> float:
    """The closed M/M/1//n queue (machine repairman): X = (1 - p0) / D, with
    p0 = 1 / sum_k n!/(n-k)! (D/Z)^k."""
    terms, t = [1.0], 1.0
    for k in range(1, n + 1):
        t *= (n - k + 1) * d / z
        terms.append(t)
    return (1.0 - 1.0 / sum(terms)) / d


@pytest.mark.parametrize("n", [1, 2, 5, 20, 60])
def test_mva_of_one_queue_is_the_machine_repairman_closed_form(n: int) -> None:
    d, z = 0.02, 0.3
    x = mva_exact(Network((Station("q", d),), think_s=z), n).throughput
    assert x == pytest.approx(_repairman_throughput(n, d, z), rel=1e-9)


def test_one_queue_without_think_time_serves_at_its_rate_whatever_the_population() -> None:
    for n in (1, 3, 50):
        sol = mva_exact(Network((Station("q", 0.25),)), n)
        assert sol.throughput == pytest.approx(4.0)
        assert sol.response_s == pytest.approx(0.25 * n)  # Little's law: n = X R
        assert sol.utilization["q"] == pytest.approx(1.0)


def test_many_customers_thinking_long_approach_the_open_mm1_response() -> None:
    # n customers each thinking Z = n / lambda: arrivals ~ Poisson(lambda) as n grows, so the
    # response tends to M/M/1's D / (1 - rho)
    d, lam, n = 0.01, 60.0, 2000
    sol = mva_exact(Network((Station("q", d),), think_s=n / lam), n)
    assert sol.response_s == pytest.approx(d / (1 - lam * d), rel=0.01)


def test_a_delay_station_adds_its_demand_and_no_queue() -> None:
    net = Network((Station("q", 0.1), Station("lat", 0.4, kind=DELAY)))
    sol = mva_exact(net, 5)
    assert sol.residence_s["lat"] == pytest.approx(0.4)
    assert sol.utilization["lat"] == 0.0


def test_kleinrock_bounds_hold_and_meet_at_the_saturation_population() -> None:
    net = Network((Station("a", 0.01), Station("b", 0.04), Station("c", 0.02)), think_s=0.13)
    b = bounds(net)
    assert b.bottleneck == "b"
    assert b.saturation == pytest.approx((0.07 + 0.13) / 0.04)  # N* = (D + Z) / D_max = 5
    for n in range(1, 60):
        assert mva_exact(net, n).throughput <= b.throughput_bound(n) * (1 + 1e-12)
    assert mva_exact(net, 400).throughput == pytest.approx(1 / 0.04, rel=1e-3)
    assert mva_exact(net, 1).throughput == pytest.approx(1 / 0.2)


def test_copies_share_a_demand_evenly() -> None:
    one = mva_exact(Network((Station("q", 0.1, copies=4),)), 1)
    assert one.response_s == pytest.approx(0.1)
    many = mva_exact(Network((Station("q", 0.1, copies=4),)), 2000)
    # a balanced network of K = 4 queues of demand D = 0.025: X(n) = n / ((n + K - 1) D)
    assert many.throughput == pytest.approx(2000 / (2003 * 0.025), rel=1e-9)
    assert bounds(Network((Station("q", 0.1, copies=4),))).max_demand_s == pytest.approx(0.025)


@pytest.mark.parametrize("n", [10, 100, 1000])
def test_schweitzer_approximates_exact_mva(n: int) -> None:
    net = Network((Station("a", 0.01), Station("b", 0.03), Station("c", 0.02, copies=8),
                   Station("lat", 0.05, kind=DELAY)), think_s=0.5)
    exact, approx = mva_exact(net, n), mva_schweitzer(net, n)
    assert approx.throughput == pytest.approx(exact.throughput, rel=0.05)
    assert solve(net, n).method == "exact MVA"
    assert solve(net, 5000).method == "Schweitzer approximate MVA"


@pytest.mark.parametrize("bad", [
    lambda: Station("q", -1.0), lambda: Station("q", math.nan), lambda: Station("q", 1, copies=0),
    lambda: Network((Station("q", 1.0),), think_s=-1), lambda: mva_exact(Network(()), 0)])
def test_bad_model_inputs_are_config_errors(bad: Any) -> None:
    with pytest.raises(ConfigError):
        bad()


# ------------------------------------------------------------------------------ simulation

def test_the_simulation_agrees_with_mva_on_a_product_form_network() -> None:
    net = Network((Station("a", 0.01), Station("b", 0.02), Station("lat", 0.05, kind=DELAY)),
                  think_s=0.1)
    for n in (1, 4, 12):
        sim = simulate_closed(net, n, cycles=3000, seed=7)
        assert sim == pytest.approx(mva_exact(net, n).throughput, rel=0.05), n
    assert simulate_closed(net, 4, 500, seed=3) == simulate_closed(net, 4, 500, seed=3)


def test_simulated_training_with_a_fixed_bottleneck_steps_at_its_service_time() -> None:
    # one rank, 2 workers, every batch 0.03 s on one shared queue, compute 0.01 s: the
    # queue sets the pace (0.03 s a step); with no demand, compute does (0.01 s)
    shape = TrainingShape(nodes=1, ranks_per_node=1, workers=2, compute_s=0.01,
                          worker_cpu_s=0.0, steps=80)
    slow = Network((Station(BANDWIDTH, 0.03),))
    assert simulate_training(shape, slow, service=Service(FIXED)) == pytest.approx(0.03)
    free = Network((Station(BANDWIDTH, 0.0),))
    assert simulate_training(shape, free, service=Service(FIXED)) == pytest.approx(0.01)
    # two nodes share the queue: each step needs both nodes' batches, 0.06 s (the prefetched
    # batches still draining in the measured window: within 2 %)
    two = TrainingShape(**{**shape.__dict__, "nodes": 2})
    assert simulate_training(two, slow, service=Service(FIXED)) == pytest.approx(0.06, rel=0.02)


def test_simulated_training_without_workers_reads_then_computes() -> None:
    shape = TrainingShape(nodes=1, ranks_per_node=1, workers=0, compute_s=0.01,
                          worker_cpu_s=0.0, steps=40)
    net = Network((Station(BANDWIDTH, 0.004), Station(LATENCY, 0.002, kind=DELAY)))
    assert simulate_training(shape, net, service=Service(FIXED)) == pytest.approx(0.016)


# ------------------------------------------------------------------------------ projection

def _node(step_s: float = 0.02, compute_s: float = 0.01, workers: int = 2,
          ops: float = 0.0, **kw: Any) -> NodeFigures:
    base: dict[str, Any] = dict(
        nodes=1, ranks_per_node=1, batch_size=32, workers=workers, compute_s=compute_s,
        step_s=step_s, worker_cpu_s=0.0, first_batch_s=0.05, sample_bytes=100_000,
        ops_per_sample=Figure(ops, "test"), epoch_samples=32 * 100, stall_s=1.0, au=0.5)
    return NodeFigures(**{**base, **kw})


def _tier(bw: float = 1e9, md: float = 1e5, client: float | None = None,
          iops: float | None = None, request_bytes: float = 4096.0) -> TierLimits:
    return TierLimits(Figure(bw, "bw"), Figure(md, "md"),
                      Figure(client, "client") if client else None,
                      Figure(iops, "iops") if iops else None, request_bytes)


@pytest.mark.parametrize("workers", [0, 2, 4])
def test_the_fitted_latency_reproduces_the_measured_node(workers: int) -> None:
    """The model's epoch at the measured node count is the measured one: its first batch,
    then 100 steps of the measured 0.025 s ((wall - first batch) / steps). Without workers
    the steps after the first take (100 x 0.025 - 0.01) / 99 each; with workers the steady
    step is a little longer still (the first batches, one a worker, were read at once: a
    head start the epoch spends)."""
    node = _node(step_s=0.025, workers=workers)
    model = ReadModel(node, _tier())
    assert model.latency_s > 0
    op = model.at(1)
    assert model.epoch(op)[0] == pytest.approx(0.05 + 100 * 0.025, rel=1e-6)
    after_first = (100 * 0.025 - 0.01) / 99
    if workers:
        assert after_first < op.step_s < 0.025 * 1.05
    else:
        assert op.step_s == pytest.approx(after_first, rel=1e-6)
    assert op.bottleneck == LATENCY  # 3.2 MB a batch at 1 GB/s: the queue idles


def test_dali_or_thread_workers_and_a_one_step_epoch_keep_the_mean_step() -> None:
    """Only PyTorch DataLoader process workers run through the loader's pipeline; others
    take the mean step and say why. A stalled epoch of one step shows no steady read:
    latency 0, said."""
    threads = ReadModel(_node(step_s=0.025, process_workers=False), _tier())
    assert not threads.pipelined and "not PyTorch DataLoader processes" in threads.latency_note
    op = threads.at(1)
    assert threads.epoch(op)[0] == pytest.approx(0.05 + 100 * 0.025, rel=1e-6)
    one = ReadModel(_node(step_s=0.025, workers=0, epoch_samples=32), _tier())
    assert one.latency_s == 0.0 and "show no steady read to fit" in one.latency_note


def test_a_node_that_kept_up_fits_no_latency_and_keeps_up_until_the_bandwidth_bound() -> None:
    node = _node(step_s=0.01, compute_s=0.01)  # 3.2 MB per 0.01 s: 320 MB/s a node
    model = ReadModel(node, _tier(bw=1e9))
    assert model.latency_s == 0.0
    assert model.bounds()[BANDWIDTH] == pytest.approx(1e9 / 320e6)  # straight line: 3.125
    assert model.at(1).au == pytest.approx(1.0)
    aus = [model.at(n).au for n in (1, 2, 3, 4, 8, 64)]
    assert aus == sorted(aus, reverse=True)
    assert model.at(64).au == pytest.approx(1e9 / 64 / 320e6, rel=0.01)  # the bound's share
    sat = model.saturation(0.9)
    assert sat is not None and 2 <= sat <= 4
    assert model.at(sat).bottleneck == BANDWIDTH


def test_a_node_that_kept_up_keeps_its_small_per_step_excess_at_every_n() -> None:
    # 1 % over compute: no latency can be seen, but the rank's own 0.1 ms a step can
    node = _node(step_s=0.0101, compute_s=0.01)
    model = ReadModel(node, _tier(bw=1e12))
    assert model.latency_s == 0.0 and model.overhead_s == pytest.approx(0.0001)
    assert model.at(1).step_s == pytest.approx(0.0101)
    assert model.epoch(model.at(1))[1] == pytest.approx(0.05 + 99 * 0.0001)  # first + steps
    assert model.at(8).step_s == pytest.approx(0.0101)  # nothing shared fills at 8
    assert "0.10 ms over compute" in model.latency_note
    stalled = ReadModel(_node(step_s=0.02, compute_s=0.01), _tier())
    assert stalled.overhead_s == 0.0  # a stalled node's excess is the fitted latency's


def test_a_given_per_step_synchronisation_adds_to_every_step_beyond_the_measured_node() -> None:
    sync = Figure(0.002, "given", given=True)
    model = ReadModel(_node(step_s=0.0101, compute_s=0.01, step_sync=sync), _tier(bw=1e12))
    assert model.at(1).step_s == pytest.approx(0.0101)  # the measured node: as it ran
    assert model.at(2).step_s == pytest.approx(0.0121)  # serial with compute, beyond it
    assert model.at(64).step_s == pytest.approx(0.0121)
    slow = ReadModel(_node(step_s=0.04, compute_s=0.01, step_sync=sync), _tier(bw=1e8))
    # where the reads set the step, the synchronisation waits inside it
    assert slow.at(4).step_s == pytest.approx(ReadModel(_node(step_s=0.04, compute_s=0.01),
                                                        _tier(bw=1e8)).at(4).step_s)


def test_metadata_and_per_client_limits_are_found_first_when_they_are_lower() -> None:
    meta = ReadModel(_node(step_s=0.01, ops=1.0), _tier(bw=1e12, md=32 / 0.01 * 5))  # 5 nodes
    assert meta.at(20).bottleneck == METADATA
    assert meta.bounds()[METADATA] == pytest.approx(5.0)
    client = ReadModel(_node(step_s=0.02), _tier(bw=1e12, client=160e6))
    assert client.bounds()[CLIENT] == 1.0  # a node asks 320 MB/s of a 160 MB/s link
    assert client.at(1000).bottleneck == CLIENT


def test_requests_per_batch_are_its_bytes_over_the_request_size_net_of_transfer() -> None:
    node = _node(sample_bytes=3000)  # batch 32: 96 kB
    assert requests_per_batch(node, _tier(request_bytes=4096.0)) == pytest.approx(96_000 / 4096)
    assert requests_per_batch(_node(sample_bytes=10, batch_size=2), _tier()) == 1.0  # at least
    # 1 / 8,000 s a request, of which 4 KiB at 1 GB/s is transfer (the bandwidth's share)
    tier = _tier(bw=1e9, iops=8000.0, request_bytes=4096.0)
    per_request = 1 / 8000 - 4096 / 1e9
    assert request_demand_s(node, tier) == pytest.approx(96_000 / 4096 * per_request)
    net = read_network(node, tier, 1, 0.0, 0.0)
    assert {s.name: s.demand_s for s in net.queues}[REQUESTS] == pytest.approx(
        96_000 / 4096 * per_request)
    # a request rate no faster than its own transfer adds nothing beyond the bandwidth
    assert request_demand_s(node, _tier(bw=1e6, iops=100.0, request_bytes=1e5)) == 0.0


# 3 kB samples, batch 32, one 3 kB request each; the probe's time per request includes its
# 3 microseconds of transfer at 1 GB/s, so 1 ms per batch of request time is this rate
_IOPS_1MS = 1 / (1 / 32_000 + 3000 / 1e9)


def test_the_request_rate_is_found_first_when_it_is_the_lowest_limit() -> None:
    # 0.01 s compute, one rank: 3,200 requests/s and 9.6 MB/s a node; the request queue is
    # full at 10 nodes, 1 GB/s and 1e6 ops/s not before 100
    node = _node(step_s=0.01, compute_s=0.01, sample_bytes=3000)
    model = ReadModel(node, _tier(bw=1e9, md=1e6, iops=_IOPS_1MS, request_bytes=3000))
    assert model.bounds()[REQUESTS] == pytest.approx(10.0)  # N* = t_c / (r x D) = 0.01 / 0.001
    assert model.bounds()[BANDWIDTH] == pytest.approx(1e9 / 9.6e6)
    sat = model.saturation(0.9)
    # prefetching readers never idle, so past the bound AU = 10 / N: 0.91 at 11, 0.83 at 12
    assert sat == 12
    assert model.at(sat).bottleneck == REQUESTS
    # far past it the step is the request queue's: N batches of 1 ms each
    assert model.at(1000).step_s == pytest.approx(1000 * 0.001, rel=0.01)
    # without the station the same node keeps up to the bandwidth bound (about 100 nodes)
    assert ReadModel(node, _tier(bw=1e9, md=1e6)).at(20).au == pytest.approx(1.0, abs=0.01)


def test_the_request_rate_station_agrees_with_the_asymptotic_bounds() -> None:
    node = _node(step_s=0.01, compute_s=0.01, sample_bytes=3000, workers=0)
    tier = _tier(bw=1e9, md=1e6, iops=_IOPS_1MS, request_bytes=3000)
    net = read_network(node, tier, 1, 0.0, 0.01)
    b = bounds(net)
    assert b.bottleneck == REQUESTS and b.max_demand_s == pytest.approx(0.001)
    # N* = (D + Z) / D_max: D = 0.001 + 96 kB / 1 GB/s, Z = 0.01
    assert b.saturation == pytest.approx((0.001 + 96_000 / 1e9 + 0.01) / 0.001)
    for n in (1, 5, 11, 50):
        assert solve(net, n).throughput <= b.throughput_bound(n) * (1 + 1e-9)
    assert solve(net, 500).throughput == pytest.approx(1 / 0.001, rel=1e-3)


def test_epochs_split_the_dataset_over_the_nodes() -> None:
    model = ReadModel(_node(step_s=0.01, compute_s=0.01), _tier(bw=1e12))
    assert model.steps_per_epoch(1) == 100
    assert model.steps_per_epoch(3) == 34
    assert model.steps_per_epoch(10_000) == 1
    wall, stall = model.epoch(model.at(4))
    assert wall == pytest.approx(25 * 0.01 + stall)


def test_the_loader_pipeline_known_answers() -> None:
    """`pipeline_wall` by hand. Two workers, two batches in flight each, reads of 0.4 s
    a batch, compute 0.1 s, first batch at 0.5 s: batches 0 and 1 come in the first wave
    (0.5), 2 and 3 at 0.9, 4 and 5 at 1.3 (4 asked for at 0.5, when batch 0 was taken),
    so the steps take them at 0.5, 0.6, 0.9, 1.0, 1.3, 1.4 and the epoch ends at 1.5; the
    steady step is a cycle over the workers, 0.2 s."""
    assert pipeline_wall((0.4,), 0.5, 6, 0.1, 0.1, 2) == pytest.approx(1.5)
    assert pipeline_wall((0.4,), 0.5, 1006, 0.1, 0.1, 2) == pytest.approx(1.5 + 1000 * 0.2)
    # reads faster than compute: the first batch, then compute alone
    assert pipeline_wall((0.15,), 0.5, 10, 0.1, 0.1, 2) == pytest.approx(0.5 + 10 * 0.1)
    # no more steps than workers: every batch came in the first wave
    assert pipeline_wall((9.0,), 0.5, 2, 0.12, 0.1, 2) == pytest.approx(0.5 + 0.12 + 0.1)
    # fewer steps than parts: a batch takes the mean cycle of the parts it spans (batch 1,
    # the epoch's second half: (0.4 + 0.0) / 2 after the first, one worker)
    assert pipeline_wall((0.8, 0.0, 0.4, 0.0), 0.3, 2, 0.0, 0.0, 1) == pytest.approx(0.5)
    # the batches in flight bound the lead the readers build where reads get slower
    slow_later = (0.01,) * 8 + (0.5,) * 8
    assert pipeline_wall(slow_later, 0.1, 64, 0.1, 0.1, 2, prefetch=50) \
        < pipeline_wall(slow_later, 0.1, 64, 0.1, 0.1, 2)
    with pytest.raises(ConfigError, match="workers"):
        pipeline_wall((0.4,), 0.5, 6, 0.1, 0.1, 0)


def _pipeline_step_by_step(cycles: tuple[float, ...], first_s: float, steps: int,
                           floor_s: float, compute_s: float, workers: int, prefetch: int) -> float:
    """The loader's recurrence (docs/projection.md, "Per epoch") batch by batch, no jumps."""
    parts, ready, taken = len(cycles), [0.0] * steps, [0.0] * steps
    for i in range(steps):
        lo = i * parts // steps
        span = cycles[lo:max(lo + 1, (i + 1) * parts // steps)]
        asked = taken[i - workers * prefetch] if i >= workers * prefetch else 0.0
        ready[i] = first_s if i < workers else (max(ready[i - workers], asked)
                                                + sum(span) / len(span))
        taken[i] = first_s if i == 0 else max(taken[i - 1] + floor_s, ready[i])
    return taken[-1] + compute_s


def test_the_pipelines_jump_over_a_parts_repeating_steps_is_exact() -> None:
    """Inside a part the recurrence repeats every W batches; jumping over the repeats gives
    the step-by-step answer (random epochs, parts, workers and in-flight counts)."""
    rng = random.Random(7)
    for _ in range(300):
        parts, workers = rng.choice([1, 4, 16]), rng.choice([1, 2, 3, 8])
        cycles = tuple(rng.uniform(0.0, 0.5) for _ in range(parts))
        floor_s = rng.uniform(0.0, 0.2)
        args = (cycles, rng.uniform(0.0, 1.0), rng.choice([1, 3, 17, 640, 3001]), floor_s,
                rng.uniform(0.0, floor_s), workers)
        prefetch = rng.choice([1, 2, 3])
        assert pipeline_wall(*args, prefetch=prefetch) == pytest.approx(
            _pipeline_step_by_step(*args, prefetch), rel=1e-12), args


def test_a_short_front_loaded_epoch_reads_its_first_batches_at_once() -> None:
    """Where the epoch's first parts are slow (k = 4) and it has few steps, the loader's
    first wave (one batch a worker, read together with the first) takes their wait off the
    steps: the stall is below the first batch plus every step at the mean step, which a
    long epoch approaches. A measured epoch of no more steps than workers has no pipeline
    to fit (`pipelined` false) and says so."""
    node = _node(step_s=0.012, compute_s=0.01, workers=4,
                 samples_per_request=Figure(4.0, "test"))
    model = ReadModel(node, _tier(bw=1e9))
    for n in (4, 8):
        op = model.at(n)
        steps = model.steps_per_epoch(n)
        _, stall = model.epoch(op)
        assert stall < model.first_batch(n) + (steps - 1) * (op.step_s - node.compute_s)
    few = ReadModel(replace(node, epoch_samples=32 * 4), _tier(bw=1e9))
    assert not few.pipelined and "came in the first wave" in few.latency_note


def test_staging_fitted_to_a_measured_copy_and_shared_by_many_nodes() -> None:
    st = StagingFigures(dataset_bytes=10**9, files=10, threads=4, chunk_bytes=2**24,
                        measured_s=5.0)
    model = StagingModel(st, _tier(bw=1e9), ops_per_file=1.0)
    assert model.time(1, "replicate") == pytest.approx(5.0, rel=1e-6)
    # a whole copy per node through 1 GB/s: at least N seconds
    assert model.time(100, "replicate") >= 100 * 1.0
    assert model.time(100, "shard") < model.time(1, "shard")
    assert break_even_epochs(10.0, 7.0, 2.0) == 2.0
    assert math.isinf(break_even_epochs(10.0, 2.0, 2.0))



def test_the_fetch_factor_counts_the_client_caches_a_request_is_fetched_by() -> None:
    assert fetches_per_request(2.0, 1) == 1.0  # one cache: once an epoch
    assert fetches_per_request(1.0, 64) == 1.0  # one sample a request: once whatever N
    assert fetches_per_request(2.0, 2) == pytest.approx(1.5)  # 2 (1 - 1/4): two draws, 2 caches
    assert fetches_per_request(3.0, 3) == pytest.approx(3 * (1 - (2 / 3) ** 3))
    assert fetches_per_request(2.0, 10**6) == pytest.approx(2.0, rel=1e-5)  # towards k


def test_a_node_per_host_fetches_k_times_the_bytes_at_scale_a_shared_cache_once() -> None:
    # bandwidth-bound at scale: 3.2 MB a batch, 100 batches/s a node, 1 GB/s; k = 2
    k2 = Figure(2.0, "test")
    own = ReadModel(_node(step_s=0.01, compute_s=0.01, samples_per_request=k2), _tier(bw=1e9))
    shared = ReadModel(_node(step_s=0.01, compute_s=0.01, samples_per_request=k2,
                             nodes_per_host=1000), _tier(bw=1e9))
    # far past the bound the step is N batches' bytes over the bandwidth, times the fetches
    assert shared.at(1000).step_s == pytest.approx(1000 * 3.2e6 / 1e9, rel=0.02)
    assert own.at(1000).step_s == pytest.approx(
        1000 * 3.2e6 / 1e9 * fetches_per_request(2.0, 1000), rel=0.02)
    assert own.bounds()[BANDWIDTH] < shared.bounds()[BANDWIDTH] == pytest.approx(1e9 / 320e6)
    assert own.at(1).step_s == shared.at(1).step_s  # one node: one cache either way


def test_a_shared_host_cpu_bounds_the_nodes_on_it_and_not_nodes_of_their_own() -> None:
    # 0.01 CPU-s a batch on 2 cores: one host delivers at most 200 batches/s; a fast tier
    cpu = Figure(0.01, "test")
    one_host = ReadModel(_node(step_s=0.01, compute_s=0.01, workers=4, cpu_s=cpu, host_cpus=2,
                               nodes_per_host=8), _tier(bw=1e15, md=1e12))
    assert one_host.at(1).au == pytest.approx(1.0)  # 100 batches/s asked, 200 possible
    # 4 nodes on the host ask 400 batches/s: each rank gets a quarter of 200
    assert one_host.at(4).step_s == pytest.approx(4 * 0.01 / 2, rel=0.03)
    assert one_host.at(4).bottleneck == CPU
    assert one_host.bounds()[CPU] == pytest.approx(2.0)  # two nodes fill it
    own = ReadModel(_node(step_s=0.01, compute_s=0.01, workers=4, cpu_s=cpu, host_cpus=2),
                    _tier(bw=1e15, md=1e12))
    assert own.at(64).step_s == pytest.approx(own.at(1).step_s)
    half = ReadModel(_node(step_s=0.01, compute_s=0.01, cpu_s=Figure(0.005, "t"), host_cpus=2,
                           nodes_per_host=8), _tier(bw=1e15, md=1e12))
    assert half.bounds()[CPU] == pytest.approx(4.0)  # 25 % of the host a node: 4 fill it
    assert ReadModel(half.node.__class__(**{**half.node.__dict__, "nodes_per_host": 2}),
                     _tier(bw=1e15, md=1e12)).bounds()[CPU] == math.inf


def test_nodes_that_share_a_host_bring_their_start_up_cpu_to_its_cores_at_once() -> None:
    # a tier and a steady CPU demand far from their limits: the first read's time does not
    # move, so the first batch moves by the start-up burst alone, (m - 1) x 0.3 CPU-s / 2
    # cores for m nodes on the host, no more beyond the host's 4
    node = _node(step_s=0.01, compute_s=0.01, workers=2, cpu_s=Figure(1e-6, "t"), host_cpus=2,
                 nodes_per_host=4, first_cpu_s=0.3)
    model = ReadModel(node, _tier(bw=1e15, md=1e12))
    assert model.first_batch(1) == pytest.approx(0.05)  # the measured one
    assert model.first_batch(2) == pytest.approx(0.05 + 0.15, rel=1e-3)
    assert model.first_batch(4) == pytest.approx(0.05 + 0.45, rel=1e-3)
    assert model.first_batch(64) == pytest.approx(0.05 + 0.45, rel=1e-3)  # 4 a host
    # measured at two nodes on the host: 0.15 CPU-s each; one node alone starts sooner
    two = ReadModel(replace(node, nodes=2), _tier(bw=1e15, md=1e12))
    assert two.first_batch(4) == pytest.approx(0.05 + 2 * 0.3 / 2 / 2, rel=1e-3)
    assert two.first_batch(1) < 0.05
    # a host per node, or no figure: the start-up stays each node's own
    for other in (replace(node, nodes_per_host=1), replace(node, first_cpu_s=None)):
        assert ReadModel(other, _tier(bw=1e15, md=1e12)).first_batch(4) == pytest.approx(
            0.05, rel=1e-3)
    # where the first read's queueing moves it more, that holds (they overlap)
    slow = ReadModel(replace(node, first_cpu_s=1e-4), _tier(bw=4e6, md=1e12))
    assert slow.first_batch(4) > 0.05 + 3 * 1e-4 / 2


def test_a_part_filled_last_host_is_not_faster_than_a_full_one() -> None:
    # 8 nodes a host, CPU-bound beyond 2: the job goes at its fullest host's pace, so AU
    # never rises with N (9 nodes: one full host and one of a node) and the bisection holds
    node = _node(step_s=0.01, compute_s=0.01, workers=4, cpu_s=Figure(0.01, "t"), host_cpus=2,
                 nodes_per_host=8)
    model = ReadModel(node, _tier(bw=1e15, md=1e12))
    aus = [model.at(n).au for n in range(1, 20)]
    assert aus == sorted(aus, reverse=True)
    assert model.at(9).au == pytest.approx(model.at(8).au, rel=0.01)
    sat = model.saturation(0.9)
    assert sat is not None and model.at(sat - 1).au >= 0.9 > model.at(sat).au
    st = StagingFigures(dataset_bytes=64 * 2**24, files=64, threads=4, chunk_bytes=2**24,
                        cpu_s=0.05, host_cpus=2, nodes_per_host=4)
    stage = StagingModel(st, _tier(bw=1e15, md=1e12), ops_per_file=1.0)
    times = [stage.time(n, "replicate") for n in range(1, 10)]
    assert times == sorted(times)


def test_the_per_client_bound_counts_the_fetch_factor_as_the_queue_does() -> None:
    # k = 2, one host a node: each node's link carries more of the tier's pages as N grows
    node = _node(step_s=0.01, compute_s=0.01, samples_per_request=Figure(2.0, "t"))
    model = ReadModel(node, _tier(bw=1e15, md=1e12, client=320e6 / 0.62))  # 62 % at N = 1
    bound = model.bounds()[CLIENT]
    assert 1 < bound < math.inf  # full once phi reaches 1 / 0.62: phi(2) = 1.5, phi(3) = 1.67
    assert bound <= 3
    sat = model.saturation(0.9)
    assert sat is not None and sat <= 3 and model.at(sat).bottleneck == CLIENT


def test_a_node_without_workers_that_kept_up_is_reproduced_exactly() -> None:
    node = _node(step_s=0.0102, compute_s=0.01, workers=0)  # 0.1 ms of reads, 0.1 ms else
    model = ReadModel(node, _tier(bw=3.2e10))
    assert model.at(1).step_s == pytest.approx(0.0102)
    assert model.overhead_s < 0.0002  # the reads are the model's, not the overhead's


def test_staging_copies_on_one_host_share_its_cpu_and_local_disk() -> None:
    # 64 chunks of 16 MiB, 0.05 CPU-s each on 2 cores: a host copies at most 40 chunks/s
    st = StagingFigures(dataset_bytes=64 * 2**24, files=64, threads=4, chunk_bytes=2**24,
                        cpu_s=0.05, host_cpus=2, nodes_per_host=4)
    model = StagingModel(st, _tier(bw=1e15, md=1e12), ops_per_file=1.0)
    assert model.time(4, "replicate") == pytest.approx(4 * 64 * 0.05 / 2, rel=0.02)
    assert model.time(4, "shard") == pytest.approx(64 * 0.05 / 2, rel=0.05)
    apart = StagingModel(StagingFigures(dataset_bytes=64 * 2**24, files=64, threads=4,
                                        chunk_bytes=2**24, cpu_s=0.05, host_cpus=2),
                         _tier(bw=1e15, md=1e12), ops_per_file=1.0)
    # a host each: every node's copy has its own cores, and this tier takes no time
    assert apart.time(4, "replicate") < 1e-3


# ------------------------------------------------------------------------ the command, end to end

def _train(tmp_path: Path, step_s: float = 0.004, compute_s: float = 0.002,
           name: str = "run.json", slower: float = 0.0, steps: int = 2) -> Path:
    """The real v3 result with chosen per-step figures (1 rank, 2 workers, batch 32, `steps`
    steps an epoch); the second epoch's step `slower` seconds longer."""
    doc = real_result()
    for i, e in enumerate(doc["epochs"]):
        step_s += slower * i
        e["summary"]["samples"] = 32 * steps
        for r in e["ranks"]:
            r["steps"] = steps
            r["compute_s"] = steps * compute_s
            r["first_batch_s"] = 0.01
            r["wall_s"] = 0.01 + steps * step_s
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _probe(tmp_path: Path) -> Path:
    doc = probe_doc("/lustre", 100.0)
    doc["summary"].update(seq_read_MBps=500.0, stat_per_s=20_000.0)
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(doc))
    return path


def _stage(tmp_path: Path, dataset: str = "cifar10") -> Path:
    doc = {"schema": "iobench.stage", "schema_version": 3, "created": "x",
           "dataset": {"dataset": dataset, "format": "hdf5"}, "mode": "replicate",
           "from": {"root": "/lustre/x"}, "to": {"root": "/nvme/x"}, "stage_s": 0.05,
           "stage_bytes": 203264, "config": {"threads": 4, "buffer_bytes": 2**24},
           "copied_files": 1}
    path = tmp_path / f"stage-{dataset}.json"
    path.write_text(json.dumps(doc))
    return path


def _with_host_cpu(path: Path, busy_s: float, cpus: int = 2, first: float | None = None
                   ) -> Path:
    doc = json.loads(path.read_text())
    for e in doc.get("epochs", []):
        e["host_cpu"] = {"busy_s": busy_s, "cpus": cpus, "source": "test",
                         **({"first_batch_busy_s": first} if first is not None else {})}
    if "epochs" not in doc:
        doc["host_cpu"] = {"busy_s": busy_s, "cpus": cpus, "source": "test"}
    path.write_text(json.dumps(doc))
    return path


def test_nodes_on_one_host_share_its_measured_cpu_and_nodes_apart_do_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 2 batches an epoch for 6 ms of the host's 2 cores: 3 ms a batch; the node asks one batch
    # per 2 ms (1.5 cores), so a second node on the host needs 3 of its 2 cores
    train = _with_host_cpu(_train(tmp_path, step_s=0.002, compute_s=0.002), 0.006)
    stage = _with_host_cpu(_stage(tmp_path), 0.04, cpus=1)  # one core: copies take turns

    def project(*extra: str) -> dict[str, Any]:
        res = tmp_path / f"res{len(extra)}"
        assert main(["project", "--train", str(train), "--probe", str(_probe(tmp_path)),
                     "--stage", str(stage), "--nodes", "1,2", "--pfs-read-gbs", "1000",
                     "--pfs-mds-ops", "1e9", "--client-gbs", "1000", "--simulate-max-nodes",
                     "2", "--no-plot", "--results", str(res), *extra]) == 0
        return json.loads(next(res.glob("projection-*.json")).read_text())

    shared, apart = project("--nodes-per-host", "4"), project()
    capsys.readouterr()
    figs = {f["name"]: f for f in shared["figures"]}
    assert figs["host CPU per batch"]["value"] == pytest.approx(0.003)
    assert figs["host cores"]["value"] == 2
    assert figs["nodes per host"]["value"] == 4 and figs["nodes per host"]["given"]
    assert figs["host CPU per staged chunk"]["value"] == pytest.approx(0.04)  # one chunk
    two = shared["points"][1]
    # at least two nodes' batches of 3 ms over 2 cores a step (the fixture also decodes)
    assert two["bottleneck"] == "cpu" and two["step_s"] >= 2 * 0.003 / 2
    assert two["au_steady"] < 0.8 and two["simulated_au"] < 0.8
    one = shared["points"][0]  # the simulation holds the decode once, as the model does
    assert one["simulated_au"] == pytest.approx(one["au"], abs=0.1)
    # the second node's copy waits for the first's core: nearly twice the time
    assert two["stage_replicate_s"] > 1.5 * shared["points"][0]["stage_replicate_s"]
    far = apart["points"][1]  # a host each: no CPU station (the probe's requests remain)
    assert "cpu" not in far["utilization"] and far["au_steady"] > two["au_steady"]
    assert not {f["name"]: f for f in apart["figures"]}["nodes per host"]["given"]
    assert main(["project", "--train", str(train), "--nodes-per-host", "0", "--probe",
                 str(_probe(tmp_path)), "--no-plot", "--results", str(tmp_path / "r")]) == 2
    assert "--nodes-per-host 0 must be >= 1" in capsys.readouterr().err


def test_the_host_cpu_until_the_first_batch_is_no_steady_work(tmp_path: Path) -> None:
    # 2 batches an epoch, 6 ms of the host's CPU, 4 ms of it until the first batch: the
    # steady figure is the 2 ms after it over the one batch after it
    train = _with_host_cpu(_train(tmp_path, step_s=0.002, compute_s=0.002), 0.006,
                           first=0.004)
    res = tmp_path / "res"
    assert main(["project", "--train", str(train), "--probe", str(_probe(tmp_path)),
                 "--nodes-per-host", "2", "--nodes", "1,2", "--no-plot",
                 "--simulate-max-nodes", "0", "--results", str(res)]) == 0
    doc = json.loads(next(res.glob("projection-*.json")).read_text())
    figs = {f["name"]: f for f in doc["figures"]}
    assert figs["host CPU per batch"]["value"] == pytest.approx(0.002)
    assert figs["host CPU until the first batch"]["value"] == pytest.approx(0.004)
    one, two = ({**p, "first": p["stall_s"] - (p["steps_per_epoch"] - 1)
                 * (p["step_s"] - 0.002)} for p in doc["points"])
    # the second node's start-up on the host's cores delays the first batch (the formula's
    # known answers: the ReadModel test above)
    assert two["first"] > one["first"]
    # an epoch without the figure: every epoch's whole CPU over its batches, none split
    d = json.loads(train.read_text())
    del d["epochs"][-1]["host_cpu"]["first_batch_busy_s"]
    train.write_text(json.dumps(d))
    assert main(["project", "--train", str(train), "--probe", str(_probe(tmp_path)),
                 "--nodes-per-host", "2", "--nodes", "1,2", "--no-plot",
                 "--simulate-max-nodes", "0", "--results", str(tmp_path / "r2")]) == 0
    doc = json.loads(next((tmp_path / "r2").glob("projection-*.json")).read_text())
    figs = {f["name"]: f for f in doc["figures"]}
    assert figs["host CPU per batch"]["value"] == pytest.approx(0.003)
    assert "host CPU until the first batch" not in figs


def test_nodes_on_a_host_without_its_cpu_figure_are_warned_of(tmp_path: Path) -> None:
    res = tmp_path / "res"
    train = _train(tmp_path)  # a result from before host_cpu
    stage = _with_host_cpu(_stage(tmp_path), 0.04, cpus=0)  # not usable
    assert main(["project", "--train", str(train), "--probe", str(_probe(tmp_path)), "--stage",
                 str(stage), "--nodes-per-host", "2", "--nodes", "1,3", "--no-plot",
                 "--simulate-max-nodes", "0", "--results", str(res)]) == 0
    doc = json.loads(next(res.glob("projection-*.json")).read_text())
    assert any("holds no host_cpu figure" in w for w in doc["warnings"])
    assert any("gives no host CPU per chunk" in w for w in doc["warnings"])
    assert "host CPU per batch" not in {f["name"] for f in doc["figures"]}


def test_the_per_step_synchronisation_is_given_listed_and_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = tmp_path / "res"
    argv = ["project", "--train", str(_train(tmp_path)), "--probe", str(_probe(tmp_path)),
            "--nodes", "1,2", "--no-plot", "--simulate-max-nodes", "0", "--results", str(res)]
    assert main([*argv, "--step-sync-ms", "1.5"]) == 0
    doc = json.loads(next(res.glob("projection-*.json")).read_text())
    fig = {f["name"]: f for f in doc["figures"]}["per-step synchronisation beyond the measured run"]
    assert fig["value"] == pytest.approx(0.0015) and fig["given"]
    capsys.readouterr()
    assert main([*argv, "--step-sync-ms", "-1"]) == 2
    assert "--step-sync-ms -1.0 must be >= 0" in capsys.readouterr().err


def test_the_command_prints_the_table_assumptions_and_writes_a_projection(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = tmp_path / "res"
    rc = main(["project", "--train", str(_train(tmp_path, slower=0.001)),
               "--probe", str(_probe(tmp_path)),
               "--stage", str(_stage(tmp_path)), "--nodes", "1,2,64,10000",
               "--pfs-mds-ops", "5000", "--simulate-max-nodes", "2", "--simulate-steps", "40",
               "--results", str(res)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PROJECTION" in out and "assumptions:" in out and "GIVEN, not measured" in out
    (path,) = res.glob("projection-*.json")
    assert path.with_suffix(".png").is_file()
    doc = json.loads(path.read_text())
    assert doc["schema"] == "iobench.projection" and doc["label"].startswith("PROJECTION")
    points = {p["nodes"]: p for p in doc["points"]}
    # fitted to the median epoch, 0.01 s + 2 x 0.0045 s: its second step holds all its wait
    # (the first step computes the first batch), 2 x 0.0045 - 0.002 s
    assert points[1]["step_s"] == pytest.approx(0.007, rel=1e-6)
    assert points[1]["au_steady"] == pytest.approx(0.002 / 0.007)
    # the epoch's AU: 2 steps of 0.002 s compute in the measured 0.019 s
    assert points[1]["au"] == pytest.approx(0.004 / 0.019)
    low, high = points[1]["au_range"]  # fitted to the slowest and fastest epoch's step
    assert low == pytest.approx(0.004 / 0.020) and high == pytest.approx(0.004 / 0.018)
    for n in (1, 2, 64, 10000):
        assert points[n]["au_range"][0] <= points[n]["au"] <= points[n]["au_range"][1], n
    assert points[1]["simulated_au"] is not None and points[64]["simulated_au"] is None
    assert points[10000]["au"] < points[1]["au"]
    assert points[2]["stage_replicate_s"] > points[1]["stage_replicate_s"]
    given = [f for f in doc["figures"] if f["given"]]
    assert [f["name"] for f in given] == ["tier metadata rate"]
    from iobench.core.results import find_documents
    from iobench.workflows.project import ProjectionDoc

    assert ProjectionDoc.from_dict(doc).points[0].nodes == 1
    # beside training results, compare and report set a projection aside and say why
    (res / "run.json").write_text((tmp_path / "run.json").read_text())
    found = find_documents([res])
    assert [p.name for p in found.results] == ["run.json"]
    assert found.skipped == [(path, "an iobench.projection document, not a training result")]


def test_the_probes_sample_size_random_reads_become_a_request_rate_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    probe = json.loads(_probe(tmp_path).read_text())
    probe["summary"].update(sample_read_iops=2000.0, sample_bs_bytes=4096, sample_bytes=3072,
                            sample_reads=[{"sample_bytes": 110_000, "bs_bytes": 110_592,
                                           "MBps": 50.0, "iops": 450.0}])
    (tmp_path / "probe.json").write_text(json.dumps(probe))
    res = tmp_path / "res"
    argv = ["project", "--train", str(_train(tmp_path, step_s=0.02, compute_s=0.01,
                                               steps=100)),
            "--probe", str(tmp_path / "probe.json"), "--nodes", "1,4,64",
            "--pfs-mds-ops", "1e9", "--pfs-read-gbs", "1000", "--client-gbs", "1000",
            "--simulate-max-nodes", "0", "--no-plot", "--results", str(res)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "request rate (random reads, requests/s)" in out
    doc = json.loads(next(res.glob("projection-*.json")).read_text())
    figs = {f["name"]: f for f in doc["figures"]}
    # the 4 KiB request (nearest the run's ~3 kB samples), not the 110 kB one
    assert figs["tier request rate"]["value"] == 2000.0
    assert not figs["tier request rate"]["given"]
    assert figs["request size"]["value"] == 4096
    batch_bytes = 32 * figs["bytes per sample"]["value"]
    assert figs["requests per batch"]["value"] == pytest.approx(batch_bytes / 4096)
    assert doc["saturation"]["resource"] == "request rate (random reads, requests/s)"
    # a node asks 100 batches/s (0.01 s compute); each batch's requests at 1 / 2,000 s less
    # their transfer at 1 TB/s
    demand = 100 * batch_bytes / 4096 * (1 / 2000 - 4096 / 1e12)
    assert doc["saturation"]["bounds"]["request rate (random reads, requests/s)"] == \
        pytest.approx(1 / demand)
    assert any("request rate is what the probe" in w for w in doc["warnings"])
    assert main([*argv, "--pfs-iops", "64000"]) == 0
    capsys.readouterr()
    newest = max(res.glob("projection-*.json"), key=lambda p: p.stat().st_mtime_ns)
    figs = {f["name"]: f for f in json.loads(newest.read_text())["figures"]}
    assert figs["tier request rate"]["given"] and figs["tier request rate"]["value"] == 64000


def _probe_with_rates(tmp_path: Path, buffered: dict[str, Any] | None) -> Path:
    """A probe of 4 KiB requests: O_DIRECT 2,000/s, 110 kB requests 450/s; with `buffered`, the
    summary's buffered figures (as the loaders read) besides."""
    probe = json.loads(_probe(tmp_path).read_text())
    probe["direct"] = True
    probe["summary"].update(sample_read_iops=2000.0, sample_bs_bytes=4096, sample_bytes=3072,
                            sample_reads=[{"sample_bytes": 110_000, "bs_bytes": 110_592,
                                           "MBps": 50.0, "iops": 450.0}])
    if buffered is not None:
        probe["summary"].update(buffered)
        probe["summary"]["sample_reads"][0].update(buffered_iops=900.0,
                                                   buffered_bs_bytes=110_592)
    path = tmp_path / "probe-rates.json"
    path.write_text(json.dumps(probe))
    return path


def _project_rates(tmp_path: Path, probe: Path, *extra: str) -> dict[str, Any]:
    res = tmp_path / "res"
    assert main(["project", "--train", str(_train(tmp_path, step_s=0.02, compute_s=0.01)),
                 "--probe", str(probe), "--nodes", "1,4,64", "--pfs-mds-ops", "1e9",
                 "--pfs-read-gbs", "1000", "--client-gbs", "1000", "--simulate-max-nodes",
                 "0", "--no-plot", "--results", str(res), *extra]) == 0
    newest = max(res.glob("projection-*.json"), key=lambda p: p.stat().st_mtime_ns)
    return json.loads(newest.read_text())


def test_the_buffered_random_reads_set_the_request_rate_as_the_loaders_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A probe with buffered random reads (as the loaders read, through the page cache): the
    request station takes their rate, not the O_DIRECT one, at the size nearest the run's
    samples, and says so in its inputs; no warning of a stand-in."""
    doc = _project_rates(tmp_path, _probe_with_rates(tmp_path, {
        "buffered_read_iops": 8000.0, "buffered_read_MBps": 32.8, "buffered_bs_bytes": 4096,
        "buffered_readers": 8}))
    out, err = capsys.readouterr()
    figs = {f["name"]: f for f in doc["figures"]}
    rate = figs["tier request rate"]
    assert rate["value"] == 8000.0 and not rate["given"]  # not 2,000 (O_DIRECT), not 900
    assert "through the page cache, as the loaders read" in rate["source"]
    assert "8 readers" in rate["source"] and "through the page cache" in out
    assert figs["request size"]["value"] == 4096
    batch_bytes = 32 * figs["bytes per sample"]["value"]
    demand = 100 * batch_bytes / 4096 * (1 / 8000 - 4096 / 1e12)
    bound = doc["saturation"]["bounds"]["request rate (random reads, requests/s)"]
    # past one node each node's client cache fetches the 4 KiB requests of its own samples:
    # k = 4096 / sample bytes, the fetch factor N (1 - (1 - 1/N)^k) on top of N x demand
    k = 4096 / figs["bytes per sample"]["value"]
    assert 1 < bound < 1 / demand
    assert bound * demand * fetches_per_request(k, math.ceil(bound)) >= 1 - 1e-9
    below = bound - 1e-6
    assert below * demand * fetches_per_request(k, math.ceil(below)) < 1
    assert not any("no figure of buffered random reads" in w for w in doc["warnings"])
    assert "no figure of buffered" not in err
    assert not any("alone make the measured node" in w for w in doc["warnings"])


def test_a_probe_that_met_a_slower_tier_than_the_node_is_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """50 requests/s of 4 KiB: a batch's 24 requests alone take 0.48 s where the node stepped
    in 0.02 s; nothing to fit, and the projection says it is pessimistic."""
    doc = _project_rates(tmp_path, _probe_with_rates(tmp_path, {
        "buffered_read_iops": 50.0, "buffered_bs_bytes": 4096, "buffered_readers": 2}))
    (w,) = [w for w in doc["warnings"] if "alone make the measured node" in w]
    assert "it ran 0.02 s" in w and "pessimistic" in w
    assert doc["model"]["latency_s"] == 0.0


def test_an_older_probe_without_buffered_reads_falls_back_to_o_direct_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A probe made before the buffered figure still loads and projects: the O_DIRECT rate
    stands in, its source says so, and a warning is printed."""
    doc = _project_rates(tmp_path, _probe_with_rates(tmp_path, None))
    err = capsys.readouterr().err
    figs = {f["name"]: f for f in doc["figures"]}
    assert figs["tier request rate"]["value"] == 2000.0
    assert "with O_DIRECT" in figs["tier request rate"]["source"]
    assert "holds no buffered figure" in figs["tier request rate"]["source"]
    batch_bytes = 32 * figs["bytes per sample"]["value"]
    demand = 100 * batch_bytes / 4096 * (1 / 2000 - 4096 / 1e12)
    assert doc["saturation"]["bounds"]["request rate (random reads, requests/s)"] == \
        pytest.approx(1 / demand)
    assert any("no figure of buffered random reads" in w for w in doc["warnings"])
    assert "WARNING: the probe holds no figure of buffered random reads" in err
    # given, the site's rate wins over either, with no stand-in warning
    doc = _project_rates(tmp_path, _probe_with_rates(tmp_path, None), "--pfs-iops", "64000")
    assert {f["name"]: f["value"] for f in doc["figures"]}["tier request rate"] == 64000
    assert not any("no figure of buffered random reads" in w for w in doc["warnings"])


def test_a_bad_buffered_figure_in_a_probe_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    probe = _probe_with_rates(tmp_path, {"buffered_read_iops": -5.0, "buffered_bs_bytes": 4096})
    _one_line_exit_2(["project", "--train", str(_train(tmp_path)), "--probe", str(probe),
                      "--no-plot", "--simulate-max-nodes", "0", "--results",
                      str(tmp_path / "r")], capsys, "buffered_read_iops")


def test_report_and_compare_show_a_projection_apart_and_labelled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = tmp_path / "res"
    train = _train(tmp_path, slower=0.001)
    assert main(["project", "--train", str(train), "--probe", str(_probe(tmp_path)),
                 "--nodes", "1,8", "--simulate-max-nodes", "0", "--no-plot",
                 "--results", str(res)]) == 0
    (res / "run.json").write_text(train.read_text())
    (res / "broken").mkdir()
    (res / "broken" / "p.json").write_text('{"schema": "iobench.projection", "points": []}')
    capsys.readouterr()
    assert main(["report", str(res), "--out", str(tmp_path / "r.md")]) == 0
    page = (tmp_path / "r.md").read_text()
    sections = page.split("\n## ")
    proj = [s for s in sections if s.startswith("PROJECTION, not measured: ")]
    assert len(proj) == 2, [s.splitlines()[0] for s in sections]
    points, inputs = proj
    assert "cifar10 (hdf5) at N nodes" in points.splitlines()[0]
    assert "| nodes | AU [spread] |" in points and "b-e shard" in points
    rows = [r for r in points.splitlines() if r.startswith("| 1 |") or r.startswith("| 8 |")]
    assert len(rows) == 2 and "[" in rows[0]  # the spread beside AU and stall
    assert "The tier stops keeping up" in points and "not a measurement" in points
    assert "| assumption |" in inputs and "| input | tier read bandwidth |" in inputs
    # the measured tables hold no projection row; the damaged one is listed as not read
    measured = [s for s in sections if not s.startswith("PROJECTION")]
    assert not any("PROJECTION" in s.split("\n", 1)[0] for s in measured)
    assert "broken/p.json" in page and "projection, not measured, unreadable" in page
    assert main(["compare", str(res)]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out and "an iobench.projection document, not a training result" in out
    tail = out[out.index("projections (projection, not measured"):]
    assert "cifar10 (hdf5)" in tail and "1-8" in tail and "AU [spread] at the last N" in tail
    assert out.index("projections (projection") > out.index("per run")  # after the runs
    answer = page.split("\n## ")[1]  # named in the report's answer, as a projection
    assert answer.startswith("The answer")
    assert "Projections (a model's prediction, not measured)" in answer
    assert "PROJECTION, not measured (projection-" in answer


def test_a_directory_of_projections_alone_is_reported_and_compared_labelled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = tmp_path / "res"
    assert main(["project", "--train", str(_train(tmp_path, slower=0.001)),
                 "--probe", str(_probe(tmp_path)), "--nodes", "1,8",
                 "--simulate-max-nodes", "0", "--no-plot", "--results", str(res)]) == 0
    capsys.readouterr()
    assert main(["report", str(res), "--out", str(tmp_path / "r.md")]) == 0
    page = (tmp_path / "r.md").read_text()
    answer = page.split("\n## ")[1]
    assert answer.startswith("The answer") and "no training runs here" in answer
    line = next(x for x in answer.splitlines() if "PROJECTION, not measured (" in x)
    assert "at N = 1-8 nodes" in line and "[" in line  # AU with its spread
    assert "## PROJECTION, not measured: cifar10 (hdf5) at N nodes" in page
    assert "the model fitted again to the fastest and the slowest measured step" in page
    assert main(["compare", str(res)]) == 0
    out = capsys.readouterr().out
    assert "projections (projection, not measured" in out and "1-8" in out


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_bad_inputs_are_one_line_and_exit_2(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    train, probe = str(_train(tmp_path)), str(_probe(tmp_path))
    base = ["project", "--train", train, "--probe", probe, "--results", str(tmp_path / "r"),
            "--no-plot", "--simulate-max-nodes", "0"]
    _one_line_exit_2([*base, "--nodes", "0,4"], capsys, "node count must be in")
    _one_line_exit_2([*base, "--pfs-read-gbs", "-3"], capsys, "must be a number > 0")
    _one_line_exit_2([*base, "--ops-per-sample", "-1"], capsys, "must be >= 0")
    _one_line_exit_2([*base, "--stage", str(_stage(tmp_path, "imagenet"))], capsys,
                     "give results of one dataset")
    _one_line_exit_2(["project", "--train", probe, "--probe", probe], capsys,
                     "is not an iobench 'iobench.result' document")
    _one_line_exit_2(["project", "--train", train, "--probe", train], capsys,
                     "is not an iobench 'iobench.probe' document")
    _one_line_exit_2(["project", "--train", train], capsys, "no read bandwidth")
    _one_line_exit_2([*base, "--trace", train], capsys, "is of run None")
    ingest = real_result()
    ingest["compute"]["kind"] = "none"
    (tmp_path / "ingest.json").write_text(json.dumps(ingest))
    _one_line_exit_2(["project", "--train", str(tmp_path / "ingest.json"), "--probe", probe],
                     capsys, "sets no demand")
    negative = real_result()
    negative["epochs"][0]["ranks"][0]["compute_s"] = -1.0
    bad = tmp_path / "neg.json"
    bad.write_text(json.dumps(negative))
    _one_line_exit_2(["project", "--train", str(bad), "--probe", probe], capsys, "compute_s")


def _trace(tmp_path: Path, run_id: str) -> Path:
    """A `train --trace` file of one rank: 20 steps of 2 ms compute, a worker's fetches of
    1 ms with every fifth 5 ms (bursts)."""
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 100, "args": {"name": "worker 0"}},
        {"name": "epoch", "ph": "X", "ts": 0.0, "dur": 60_000.0, "pid": 0, "tid": 1,
         "args": {"repeat": 0, "epoch": 0, "steps": 20}}]
    for k in range(20):
        a = {"repeat": 0, "epoch": 0, "step": k}
        ev.append({"name": "compute", "ph": "X", "ts": 3000.0 * k, "dur": 2000.0, "pid": 0,
                   "tid": 4, "args": a})
        ev.append({"name": "fetch", "ph": "X", "ts": 3000.0 * k, "pid": 0, "tid": 100,
                   "dur": 5000.0 if k % 5 == 0 else 1000.0, "args": a})
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": ev, "otherData": {"iobench": {"run_id": run_id}}}))
    return path


def test_a_trace_drives_the_simulation_with_its_compute_and_bursts(tmp_path: Path) -> None:
    from iobench.core.results import load_typed
    from iobench.workflows.project import ProjectConfig, _trace_service, run_projection

    train = _train(tmp_path)
    run_id = json.loads(train.read_text())["run_id"]
    service = _trace_service(_trace(tmp_path, run_id), load_typed(train))
    assert service.compute_s == pytest.approx((0.002,) * 20)
    assert sorted(set(round(f, 6) for f in service.factors)) == pytest.approx([1 / 1.8, 5 / 1.8])
    cfg = ProjectConfig(train=train, probes=(_probe(tmp_path),), trace=tmp_path / "trace.json",
                        nodes=(1, 2), simulate_max_nodes=2, simulate_steps=40)
    doc = run_projection(cfg)
    assert all(p.simulated_au is not None and 0 < p.simulated_au <= 1 for p in doc.points)
    assert "driven by the trace" in doc.model.simulation
    again = run_projection(cfg)  # seeded: the same answer
    assert [p.simulated_au for p in again.points] == [p.simulated_au for p in doc.points]


# ------------------------------------------------------- several probes: medians and spread

def _probes(tmp_path: Path, rates: tuple[float, ...], bandwidths: tuple[float, ...],
            **storage: str) -> list[str]:
    """Probes of one tier whose buffered 4 KiB reads ran at `rates` and whose sequential
    reads at `bandwidths` MB/s (the tier's other load changing between them)."""
    paths = []
    for i, (rate, bw) in enumerate(zip(rates, bandwidths, strict=True)):
        doc = json.loads(_probe_with_rates(tmp_path, {
            "buffered_read_iops": rate, "buffered_bs_bytes": 4096,
            "buffered_readers": 8}).read_text())
        doc["summary"]["seq_read_MBps"] = bw
        doc["storage"].update(storage)
        path = tmp_path / f"probe-{i}.json"
        path.write_text(json.dumps(doc))
        paths.append(str(path))
    return paths


def _project_probes(tmp_path: Path, probes: list[str], *extra: str) -> dict[str, Any]:
    res = tmp_path / "res"
    argv = ["project", "--train", str(_train(tmp_path, step_s=0.02, compute_s=0.01)),
            *(x for p in probes for x in ("--probe", p)), "--stage", str(_stage(tmp_path)),
            "--nodes", "1,4,64", "--pfs-mds-ops", "1e9", "--simulate-max-nodes", "0",
            "--no-plot", "--results", str(res), *extra]
    assert main(argv) == 0
    newest = max(res.glob("projection-*.json"), key=lambda p: p.stat().st_mtime_ns)
    return json.loads(newest.read_text())


def test_several_probes_give_the_median_of_each_figure_and_carry_their_spread(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three probes of one tier, 1,000-3,000 buffered reads/s and 400-600 MB/s: the model
    takes the medians (2,000/s, 500 MB/s; the old "best of" took 3,000 and 600), says so in
    the inputs and the assumptions, and the [spread] of stall, AU and staging comes from
    the tier at the least and the greatest figures."""
    doc = _project_probes(tmp_path, _probes(tmp_path, (3000.0, 1000.0, 2000.0),
                                            (600.0, 400.0, 500.0)))
    out = capsys.readouterr().out
    figs = {f["name"]: f for f in doc["figures"]}
    rate, bw = figs["tier request rate"], figs["tier read bandwidth"]
    assert rate["value"] == 2000.0 and rate["span"] == [1000.0, 3000.0]
    assert bw["value"] == pytest.approx(500.0) and bw["span"] == pytest.approx([400.0, 600.0])
    assert "median of 3 probes, 1,000-3,000 reads/s" in rate["source"]
    assert "median of 3 probes, 400-600 MB/s" in bw["source"]
    assert "tier request rate: 2000 [1000-3000] requests/s (measured: median of 3 probes" in out
    assert any("median of 3 probes" in a and "not the best" in a
               for a in doc["model"]["assumptions"])
    assert "all at the greatest the probes measured" in doc["model"]["spread_note"]
    assert "[spread]: " in out
    for p in doc["points"]:  # the central value lies in its spread, which has width past N = 1
        for value, span in ((p["stall_s"], p["stall_range_s"]), (p["au"], p["au_range"]),
                            (p["stage_replicate_s"], p["stage_replicate_range_s"]),
                            (p["stage_shard_s"], p["stage_shard_range_s"])):
            assert span[0] <= value * (1 + 1e-9) and value <= span[1] * (1 + 1e-9), p["nodes"]
    at64 = next(p for p in doc["points"] if p["nodes"] == 64)
    assert at64["stall_range_s"][1] > at64["stall_range_s"][0] * 1.5
    assert at64["stage_replicate_range_s"][1] > at64["stage_replicate_range_s"][0]


def test_one_probe_keeps_its_figures_without_a_spread(tmp_path: Path) -> None:
    doc = _project_probes(tmp_path, _probes(tmp_path, (1000.0,), (400.0,)))
    figs = {f["name"]: f for f in doc["figures"]}
    assert figs["tier request rate"]["value"] == 1000.0
    assert figs["tier request rate"].get("span", []) == []
    assert "probe probe-0.json" in figs["tier request rate"]["source"]
    assert all(not p.get("stage_replicate_range_s") for p in doc["points"])


def test_the_spread_of_a_request_rate_bounds_the_saturated_step_in_closed_form() -> None:
    """Far past the request queue's bound a step is N batches of its service demand (the
    bottleneck law; one rank, prefetching workers): a rate spread [lo, hi] gives the step
    N x requests x (1/rate - bytes/bandwidth) at each end, the median's between."""
    node = _node(step_s=0.01, compute_s=0.01, sample_bytes=3000)
    requests = 32 * 3000 / 3000

    def demand(rate: float) -> float:
        return requests * (1 / rate - 3000 / 1e9)

    tier = TierLimits(Figure(1e9, "bw"), Figure(1e6, "md"), None,
                      Figure(16_000.0, "iops", span=(8_000.0, 32_000.0)), 3000.0)
    ends = tier.ends()
    assert ends is not None
    slow, fast = ends
    assert slow.requests_per_s is not None and slow.requests_per_s.value == 8_000.0
    assert fast.requests_per_s is not None and fast.requests_per_s.value == 32_000.0
    steps = [ReadModel(node, t).at(1000).step_s for t in (fast, tier, slow)]
    assert steps == pytest.approx([1000 * demand(r) for r in (32_000, 16_000, 8_000)], rel=0.01)
    assert TierLimits(Figure(1e9, "bw"), Figure(1e6, "md")).ends() is None
    with pytest.raises(ConfigError, match="must lie in its span"):
        Figure(5.0, "x", span=(6.0, 8.0))


def test_probes_of_different_tiers_or_datasets_are_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = str(_train(tmp_path))
    lustre = _probes(tmp_path, (1000.0, 2000.0), (400.0, 500.0))
    gluster = json.loads(Path(lustre[1]).read_text())
    gluster["storage"].update(fstype="fuse.glusterfs", source="vm:/iobench")
    (tmp_path / "gluster.json").write_text(json.dumps(gluster))
    base = ["project", "--train", train, "--no-plot", "--simulate-max-nodes", "0",
            "--results", str(tmp_path / "r"), "--probe", lustre[0]]
    _one_line_exit_2([*base, "--probe", str(tmp_path / "gluster.json")], capsys,
                     "the probes measured different tiers")
    other = json.loads(Path(lustre[1]).read_text())
    other["summary"]["sample_bytes"] = 110_000
    (tmp_path / "imagenet.json").write_text(json.dumps(other))
    _one_line_exit_2([*base, "--probe", str(tmp_path / "imagenet.json")], capsys,
                     "the probes read samples of different datasets")
    # two folders of one mount are one tier
    same = json.loads(Path(lustre[1]).read_text())
    same["storage"]["path"] = "/lustre/elsewhere"
    for p, folder in ((lustre[0], "/lustre/a"), (lustre[1], "/lustre/b")):
        d = json.loads(Path(p).read_text())
        d["storage"].update(path=folder, mount_point="/lustre")
        Path(p).write_text(json.dumps(d))
    assert main([*base, "--probe", lustre[1]]) == 0
