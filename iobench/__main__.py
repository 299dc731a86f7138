"""`python -m iobench` runs the command-line interface."""

from iobench.cli import run

run()
