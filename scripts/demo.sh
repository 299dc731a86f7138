#!/usr/bin/env bash
# `make demo`: the quick start on a small default dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
iobench info .
