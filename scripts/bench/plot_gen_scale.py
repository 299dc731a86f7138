"""Plot the figures of gen_scale.py: generation rate against the number of ranks, with fio.

    .venv/bin/python scripts/bench/plot_gen_scale.py FIGURES.json [--out docs/img/gen-scaling.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("figures", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs/img/gen-scaling.png"))
    a = ap.parse_args()
    doc = json.loads(a.figures.read_text())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks, figs, cores = doc["ranks"], doc["figures"], doc["cores"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, style in [("fio", "k--"), *((d, "o-") for d in figs if d != "fio")]:
        med = [statistics.median(figs[name][str(n)]["MBps"]) for n in ranks]
        lo = [min(figs[name][str(n)]["MBps"]) for n in ranks]
        hi = [max(figs[name][str(n)]["MBps"]) for n in ranks]
        label = "fio write + fsync (disk limit)" if name == "fio" else f"iobench generate {name}"
        ax.errorbar(ranks, med, yerr=[[m - x for m, x in zip(med, lo, strict=True)],
                                      [x - m for m, x in zip(med, hi, strict=True)]],
                    fmt=style, capsize=3, label=label)
    ax.axvspan(cores + 0.5, max(ranks) + 0.5, color="0.9", label=f"oversubscribed (> {cores} cores)")
    ax.set_xticks(ranks)
    ax.set_xlim(min(ranks) - 0.5, max(ranks) + 0.5)
    ax.set_xlabel("MPI ranks (mpiexec -n N)")
    reps = len(figs["fio"][str(ranks[0])]["MBps"])
    ax.set_ylabel(f"MB/s (median of {reps}, bars: min-max)")
    ax.set_title(f"Generation scale-out, HDF5, {doc['info']['date']}, {doc['info']['host']}",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
