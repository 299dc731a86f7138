#!/usr/bin/env python3
"""What each model asks of the storage: its compute-only rate (`iobench.core.demand`) on a resident batch.

For each MODEL:BATCH, a batch in the compact form the loaders deliver (uint8 crops for
imagenet and cifar10, int16 volumes for cosmoflow), already on the device, trains the
model as `iobench train` does (the batch's `Finish` first, then forward, backward and an
SGD step; `--amp` bfloat16 autocast and `--channels-last` on a GPU), `--warmup` untimed and
`--steps` timed steps, synchronised with CUDA. Prints samples/s and ms/step, and the
storage bandwidth that rate needs (the stored bytes a sample takes).

  python scripts/bench/model_demand.py resnet50:128 resnet50:256 cosmoflow:4 cnn:64 \\
      [--amp] [--channels-last] [--warmup 5] [--steps 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from iobench.core.datasets import DATASETS
from iobench.core.demand import compute_rate
from iobench.core.models import MODELS, build_model, channels_last_model, parse_model
from iobench.loaders._preprocess import CROP, FINISH

# the compact batch each dataset's loaders deliver, per sample: (shape, dtype)
COMPACT = {"imagenet": ((CROP, CROP, 3), torch.uint8), "cifar10": ((3, 32, 32), torch.uint8),
           "cosmoflow": ((128, 128, 128, 4), torch.int16)}


def one(model_name: str, batch: int, a: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    spec = parse_model(model_name)
    dataset = spec.datasets[0]
    ds = DATASETS[dataset]
    outputs = ds.num_classes or math.prod(ds.label_shape)
    torch.manual_seed(0)
    model = build_model(model_name, outputs).to(device)
    if a.channels_last:
        model = channels_last_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr_for(batch), momentum=0.9, nesterov=True)
    shape, dtype = COMPACT[dataset]
    x = (torch.randint(0, 256, (batch, *shape), dtype=dtype) if dtype == torch.uint8
         else torch.randint(0, 4000, (batch, *shape), dtype=dtype)).to(device)
    if spec.task == "classification":
        y, loss = torch.randint(0, outputs, (batch,), device=device), torch.nn.CrossEntropyLoss()
    else:
        y, loss = torch.rand(batch, outputs, device=device), torch.nn.MSELoss()
    amp = (torch.autocast("cuda", dtype=torch.bfloat16)
           if a.amp and device.type == "cuda" else None)
    d = compute_rate(model, opt, loss, x, y, finish=FINISH[dataset], autocast=amp,
                     channels_last=a.channels_last, warmup=a.warmup, steps=a.steps)
    sample_bytes = ds.sample_nbytes  # None for JPEG: a file's size varies
    return {"model": model_name, "batch": batch, **d.to_dict(),
            "needs_MBps": d.samples_per_s * sample_bytes / 1e6 if sample_bytes else None}


def num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help=f"MODEL:BATCH ({', '.join(MODELS)})")
    p.add_argument("--amp", action="store_true")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# compute-only rates on {name} ({time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}; "
          f"amp {a.amp}, channels-last {a.channels_last}, {a.warmup} warm-up + {a.steps} "
          "timed steps)\n\n| model | batch | samples/s | ms/step | storage needs (MB/s) |\n"
          "|---|---|---|---|---|")
    rows = []
    for run in a.runs:
        model_name, _, batch = run.partition(":")
        r = one(model_name, int(batch or 64), a, device)
        rows.append(r)
        need = num(r["needs_MBps"]) if r["needs_MBps"] else "(JPEG: per file size)"
        print(f"| {model_name} | {r['batch']} | {num(r['samples_per_s'])} | "
              f"{num(r['ms_per_step'])} | {need} |", flush=True)
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
