"""PLACEHOLDER: `iobench sweep` is being built; its owner replaces this whole file."""

from __future__ import annotations

import argparse

from iobench.errors import UnsupportedError


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> int:
    raise UnsupportedError("`iobench sweep` is not built yet")
