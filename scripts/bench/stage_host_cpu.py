"""The host's CPU for one staging copy at several ranks x copy workers on one host, interleaved.

    .venv/bin/python scripts/bench/stage_host_cpu.py --src DATASET_ROOT --work DIR
        [--configs S1x4,S4x4,S1x16,R4x4] [--rounds 3] [--before DIR] [--evict-cmd CMD]

A projection of nodes that share a host takes the host's busy CPU per staged chunk
from one node's stage result (`iobench project --nodes-per-host`). That holds only if
one copy costs the host the same CPU whether one rank with 4 workers or 4 ranks with
4 each copy it. Each config copies from a cold source with W copy workers a rank
(`RxW`): `S`, a shard, is one copy over `mpiexec -n R` ranks, `iobench stage --repeat 3`;
`R`, a replicate, is R processes at once, each a whole copy, once (each would evict the
tier during the others'). It prints the median over every repetition of
`stage_s` and of the host's busy CPU per copy (the result's `host_cpu`; for `R`, the
longest window's over R copies), with the CPU seconds of the GlusterFS bricks and of the
FUSE client of the source's mount (`pgrep`; 0 elsewhere) over each whole command.
`--before DIR` runs an older iobench from DIR beside this one, interleaved (PYTHONPATH,
from a neutral working directory so that `-m iobench` does not find this checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MPIEXEC = str(BIN / "mpiexec") if (BIN / "mpiexec").exists() else "mpiexec"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pattern: str) -> float:
    """CPU seconds so far of the processes whose command line matches `pattern`."""
    pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    total = 0
    for pid in pids.split():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def mount_of(path: Path) -> str:
    """The mount point that holds `path` (its FUSE client's command line ends with it)."""
    return subprocess.run(["findmnt", "-n", "-o", "TARGET", "-T", str(path)],
                          capture_output=True, text=True, check=True).stdout.strip()


def one(kind: str, ranks: int, workers: int, code: str | None, a: argparse.Namespace
        ) -> tuple[list[float], list[float], float, float]:
    """One config's command: per repetition stage_s and host CPU per copy; bricks', client's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{BIN}:{os.environ['PATH']}"}
    if code:
        env["PYTHONPATH"] = code
    tag = f"{'before' if code else 'this'}-{kind}{ranks}x{workers}"
    copies = ranks if kind == "R" else 1
    dests = [a.work / f"{tag}-d{i}" for i in range(copies)]
    results = [a.work / f"{tag}-r{i}" for i in range(copies)]
    for p in dests + results:
        shutil.rmtree(p, ignore_errors=True)
    # R: copies evict the shared tier in each other's, so once each (project_validate's rule)
    opts = ["--no-progress", "--threads", str(workers), "--repeat", "1" if kind == "R" else "3",
            *(["--evict-cmd", a.evict_cmd] if a.evict_cmd else [])]
    iob = [sys.executable, "-m", "iobench", "stage", "--from", str(a.src)]
    client = f"glusterfs .*{mount_of(a.src)}$"
    b0, c0 = cpu_s("glusterfsd"), cpu_s(client)
    if kind == "S":
        subprocess.run([MPIEXEC, "-n", str(ranks), *iob, "--to", str(dests[0]), "--results",
                        str(results[0]), *opts], env=env, cwd=a.work, check=True,
                       stdout=subprocess.DEVNULL)
    else:
        procs = [subprocess.Popen([*iob, "--to", str(d), "--results", str(r), *opts], env=env,
                                  cwd=a.work, stdout=subprocess.DEVNULL)
                 for d, r in zip(dests, results, strict=True)]
        if any(p.wait() != 0 for p in procs):
            sys.exit(f"stage failed ({tag})")
    b1, c1 = cpu_s("glusterfsd"), cpu_s(client)
    docs = [json.loads(next(r.glob("stage-*.json")).read_text()) for r in results]
    reps = list(zip(*(d["repetitions"] for d in docs), strict=True))
    return ([max(r["stage_s"] for r in rep) for rep in reps],
            [max(r["host_cpu"]["busy_s"] for r in rep) / copies for rep in reps],
            (b1 - b0) / copies, (c1 - c0) / copies)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, required=True, help="a dataset's root on the tier")
    ap.add_argument("--work", type=Path, required=True, help="copies and results go here")
    ap.add_argument("--configs", default="S1x4,S4x4,S1x16,R4x4")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved commands per config")
    ap.add_argument("--before", default=None, metavar="DIR", help="an older iobench checkout")
    ap.add_argument("--evict-cmd", default=None, help="stage's --evict-cmd (GlusterFS: "
                    "'scripts/pfs/local-gluster.sh evict')")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    configs = [(c[0], *map(int, c[1:].split("x"))) for c in a.configs.split(",")]
    codes = [None, a.before] if a.before else [None]
    rows: dict[tuple[object, ...], list[tuple[list[float], list[float], float, float]]] = {}
    for r in range(a.rounds):
        for kind, ranks, workers in configs:
            for code in (codes if r % 2 == 0 else codes[::-1]):
                out = one(kind, ranks, workers, code, a)
                rows.setdefault((kind, ranks, workers, code), []).append(out)
                print(f"round {r + 1}: {kind}{ranks}x{workers} {'before' if code else 'this'}"
                      f" stage_s {[round(x, 3) for x in out[0]]} CPU-s/copy "
                      f"{[round(x, 2) for x in out[1]]}", flush=True)
    print("\n| config | code | stage_s median [range] | host CPU-s per copy | bricks CPU-s "
          "| FUSE client CPU-s |\n|---|---|---|---|---|---|")
    for (kind, ranks, workers, code), outs in rows.items():
        st = [x for o in outs for x in o[0]]
        cpu = [x for o in outs for x in o[1]]
        print(f"| {kind}{ranks}x{workers} | {'before' if code else 'this'} "
              f"| {statistics.median(st):.3f} [{min(st):.3f}-{max(st):.3f}] "
              f"| {statistics.median(cpu):.2f} | {statistics.median(o[2] for o in outs):.2f} "
              f"| {statistics.median(o[3] for o in outs):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
