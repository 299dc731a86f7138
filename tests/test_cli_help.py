"""The help a user reads: every default stated, examples on their own lines, the README's
option values the CLI's own."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from iobench.cli import SUBCOMMANDS, build_parser
from iobench.core.workloads import WORKLOADS

README = Path(__file__).resolve().parents[1] / "README.md"


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser(name)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_every_default_is_stated_and_no_help_names_an_issue(name: str) -> None:
    p = _subparser(name)
    for a in p._actions:
        if not a.option_strings or a.help in (None, argparse.SUPPRESS):
            continue
        assert not re.search(r"\bissue \d+", a.help), (name, a.option_strings, a.help)
        if a.default in (None, False, [], argparse.SUPPRESS):
            continue
        assert "default" in a.help.lower(), (name, a.option_strings[-1], a.default, a.help)


def test_examples_in_a_description_keep_their_lines() -> None:
    text = _subparser("emulate-pfs").format_help()
    examples = [ln for ln in text.splitlines() if "iobench emulate-pfs --" in ln]
    assert len(examples) >= 4 and all(ln.startswith("  iobench emulate-pfs") for ln in examples)


def test_the_readme_names_the_workloads_the_cli_takes() -> None:
    listed = re.findall(r"--workload ((?:[a-z0-9-]+\\?\|)+[a-z0-9-]+)", README.read_text())
    assert listed, "the README lists no --workload names"
    for names in listed:
        assert names.replace("\\", "").split("|") == list(WORKLOADS), names
