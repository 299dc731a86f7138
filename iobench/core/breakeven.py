"""The staging break-even (docs/metrics.md): epochs until staging a dataset pays for itself.

`staging_pairs` is the one break-even of staging, used by `iobench compare`,
`iobench report` and the verdict.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from iobench.core.result_types import StageDoc, Staging, StagingSpread, TrainResult
from iobench.core.spread import differs, repetition_figures, run_spread, spread


def root_of(place: Any) -> str | None:
    """The root of a staging's `from`/`to` (an object with `root`, or a bare path)."""
    root = place.get("root") if isinstance(place, dict) else place
    return root if isinstance(root, str) else None


def _fstype(place: Any) -> str | None:
    fstype = place.get("fstype") if isinstance(place, dict) else None
    return fstype if isinstance(fstype, str) else None


def real(path: str | None) -> str:
    """The real path of a dataset root (symlinks and `..` resolved); '' for None."""
    return os.path.realpath(path) if path else ""


def staging_record(doc: TrainResult | StageDoc) -> dict[str, Any] | None:
    """The staging a document describes, or None: an `iobench.stage` result, or a training
    result with a `staging` section (`iobench train --stage-to`).

    With `--repeat N` stagings (a `spread` section), `stage_s` and `stage_MBps`
    are the medians and `stage_spread` the spread of `stage_s`.
    """
    st: Staging
    if isinstance(doc, StageDoc):
        st, run = doc, None
    elif doc.staging is not None:
        st, run = doc.staging, doc
    else:
        return None
    sp = st.spread or StagingSpread(stage_s=None, stage_MBps=None)
    resumed = st.skipped_files
    return {
        "stage_s": sp.stage_s.median if sp.stage_s else st.stage_s,
        "stage_spread": sp.stage_s.to_dict() if sp.stage_s else None,
        "stage_bytes": st.stage_bytes,
        "stage_MBps": sp.stage_MBps.median if sp.stage_MBps else st.stage_MBps,
        "repeats": st.repeats or 1,
        "mode": (st.mode or "n/a") + (f" (resumed: {resumed} files were already there)"
                                      if resumed else ""),
        "resumed": resumed,
        "from": real(root_of(st.source)), "to": real(root_of(st.dest)),
        "from_kind": _fstype(st.source), "to_kind": _fstype(st.dest),
        "dataset": doc.dataset.dataset, "format": doc.dataset.format,
        "staged_run": run,
    }


def _comparable_key(doc: TrainResult) -> dict[str, Any]:
    """What must be equal for two runs' epoch times to differ by their storage alone."""
    c, comp, ds = doc.config, doc.compute, doc.dataset
    return {"dataset": ds.dataset, "format": ds.format, "samples": ds.num_samples,
            "compute": comp.kind, "model": comp.model,
            "compute_time_s": comp.compute_time_s, "decode": comp.decode,
            "batch_size": c.batch_size, "ranks": doc.world.size, "loader": c.loader,
            "workers": c.workers, "shuffle": c.shuffle,
            "max_steps": c.max_steps, "cache": doc.cache.mode}


def comparability(slow: TrainResult, fast: TrainResult) -> list[str]:
    """Why two runs' epoch times are not comparable, one `field a vs b` each; [] when they are.

    Dataset (name, format, samples), compute (kind, model, emulated step time,
    decode), batch size, ranks, loader, workers, shuffle, steps per epoch and
    cache mode must match.
    """
    a, b = _comparable_key(slow), _comparable_key(fast)
    return [f"{k} {a[k]} vs {b[k]}" for k in a if a[k] != b[k]]


def outcome(row: Mapping[str, Any]) -> str:
    """What a `staging_pairs` row answers: `pays off` (after `break_even_epochs`), `never`
    (the copy was not faster: no evidence that staging pays, whatever the spread), `not
    significant` (faster, but the two epoch times are within their spread: no number is
    given), or `not computed` (refused, resumed, or no runs to compare)."""
    be = row.get("break_even_epochs")
    if row.get("refused") or be is None:
        return "not computed"
    if math.isinf(be):
        return "never"
    return "not significant" if row.get("significant") is False else "pays off"


def break_even_text(row: Mapping[str, Any]) -> str:
    """The break-even of a `staging_pairs` row for tables: epochs, `never`, `n.s.` (no number:
    the epoch times are within their spread), or why not."""
    what = outcome(row)
    if row.get("refused"):
        return f"not computed: {row['refused']}"
    if what == "not computed":
        return "n/a (resumed staging: not a full staging cost)" if row.get("resumed") else "n/a"
    if what == "not significant":
        return (f"n.s. (not significant: epoch times {row['epoch_slow_s']:.3g} s vs "
                f"{row['epoch_fast_s']:.3g} s are within their spread over "
                f"{row.get('spread_over') or 'repetitions'})")
    return "never" if what == "never" else f"{row['break_even_epochs']:.2f}"


def epoch_significance(slow: TrainResult, fast: TrainResult
                       ) -> tuple[bool | None, str | None]:
    """Whether two runs' epoch walls differ beyond their spread, and what the spread is over:
    their repetitions (`iobench.core.spread.differs` of `run_spread`), or where both are
    single passes, their cold epochs (each one a pass over the data from a cold cache);
    (None, None) when neither has two of either."""
    a, b = run_spread(slow.epochs)["epoch_wall_s"], run_spread(fast.epochs)["epoch_wall_s"]
    sig = differs(a, b)
    if sig is not None:
        return sig, "repetitions"
    sig = differs(spread(e.summary.wall_s for e in slow.epochs),
                  spread(e.summary.wall_s for e in fast.epochs))
    return (sig, "epochs") if sig is not None else (None, None)


def jsonable_break_even(value: float | None) -> float | str | None:
    """`break_even_epochs` for JSON: the word `never` for infinity (JSON has no infinity)."""
    return "never" if value is not None and math.isinf(value) else value


def break_even(staging: Mapping[str, Any], slow: TrainResult,
               fast: TrainResult) -> dict[str, Any]:
    """Staging cost against the epoch time it saves, per docs/metrics.md.

    `slow` reads the staging's source in place, `fast` the staged copy.
    `break_even_epochs` = stage_s / (epoch_wall_slow - epoch_wall_fast), with
    epoch walls the medians over repetitions (seconds) and stage_s the
    median over repeated stagings: epochs until staging pays for itself;
    math.inf when staging does not make epochs faster; None when the runs
    are not comparable (`refused` says why) or the staging was resumed
    (part of the data was already there: its time is no staging cost).
    `significant` is whether the two epoch walls differ beyond their spread, and
    `spread_over` what that spread is over (`epoch_significance`).
    """
    c = slow.config
    out = {**staging, "slow_run_id": slow.run_id, "fast_run_id": fast.run_id,
           "run": f"{c.loader}, {c.workers} workers, batch {c.batch_size}, shuffle {c.shuffle}",
           "refused": None, "epoch_slow_s": None, "epoch_fast_s": None, "epoch_slow": None,
           "epoch_fast": None, "significant": None, "spread_over": None,
           "break_even_epochs": None, "epochs": None, "in_place_s": None,
           "staged_total_s": None}
    out.pop("staged_run", None)
    diff = comparability(slow, fast)
    if diff:
        out["refused"] = ("runs not comparable: " + ", ".join(diff)
                          + " (in place vs staged)")
        return out
    slow_sp, fast_sp = run_spread(slow.epochs)["epoch_wall_s"], \
        run_spread(fast.epochs)["epoch_wall_s"]
    if not slow_sp or not fast_sp:
        out["refused"] = "a run has no epochs"
        return out
    slow_s, fast_s = slow_sp["median"], fast_sp["median"]
    gain = slow_s - fast_s
    stage_s = staging["stage_s"]
    epochs = repetition_figures(slow.epochs)[0]["epochs"]
    significant, over = epoch_significance(slow, fast)
    out.update({
        "epoch_slow_s": slow_s, "epoch_fast_s": fast_s, "epoch_slow": slow_sp,
        "epoch_fast": fast_sp, "significant": significant, "spread_over": over,
        "break_even_epochs": None if staging["resumed"] else
        stage_s / gain if gain > 0 else math.inf,
        # time to solution for the runs' epoch count, in place vs staged
        "epochs": epochs, "in_place_s": slow_s * epochs,
        "staged_total_s": stage_s + fast_s * epochs,
    })
    return out


def staging_pairs(runs: Sequence[TrainResult | Mapping[str, Any]],
                  stages: Sequence[StageDoc | Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Every staging paired with the in-place runs of its source: `break_even` rows.

    A staging is a training result with a `staging` section (its own epochs
    are the staged ones) or an `iobench stage` result in `stages` (the staged
    epochs come from runs reading its destination). The in-place runs are
    those without staging whose dataset root is the staging's source, by real
    path, whatever the order the runs were given in. A staging without any
    in-place run gets one row with `run` None and `refused` saying so. Rows of
    one staging share their `staging_index`.
    """
    out = []
    typed = [TrainResult.of(r) for r in runs]
    docs: list[TrainResult | StageDoc] = [*map(StageDoc.of, stages), *typed]
    stagings = [st for st in map(staging_record, docs) if st is not None]
    for k, st in enumerate(stagings):
        st = {**st, "staging_index": k}
        fasts = ([st["staged_run"]] if st["staged_run"] is not None else
                 [r for r in typed if real(r.dataset.root) == st["to"]])
        slows = [r for r in typed if r.staging is None and real(r.dataset.root) == st["from"]]
        pairs = [(a, b) for a in slows for b in fasts if a is not b]
        if not pairs:
            row = {**st, "run": None, "slow_run_id": None,
                   "fast_run_id": st["staged_run"].run_id if st["staged_run"] else None,
                   "epoch_slow_s": None, "epoch_fast_s": None, "epoch_slow": None,
                   "epoch_fast": None, "significant": None, "spread_over": None,
                   "break_even_epochs": None, "epochs": None, "in_place_s": None,
                   "staged_total_s": None,
                   "refused": f"no in-place run of {st['from']}" if not slows else
                   f"no run of the staged copy {st['to']}"}
            row.pop("staged_run")
            out.append(row)
            continue
        out += [break_even(st, a, b) for a, b in pairs]
    return out
