"""A Ctrl-C while the CLI imports a subcommand's module is one line, never a traceback."""

from __future__ import annotations

import importlib
import importlib.abc
import sys

import pytest

from iobench.cli import RANKED_COMMANDS, SUBCOMMANDS, main


def test_the_ranked_table_names_exactly_the_modules_that_set_ranked() -> None:
    ranked = {name for name, (module, _) in SUBCOMMANDS.items()
              if getattr(importlib.import_module(module), "RANKED", False)}
    assert ranked == RANKED_COMMANDS


class _CtrlCOnImport(importlib.abc.MetaPathFinder):
    """Raises KeyboardInterrupt, as a SIGINT there would, when `name` is imported."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == self.name:
            raise KeyboardInterrupt
        return None


@pytest.mark.parametrize("command", sorted(RANKED_COMMANDS) + ["generate"])
def test_a_ctrl_c_while_the_subcommand_module_is_imported_is_one_line(
        command, monkeypatch, capsys) -> None:
    module = SUBCOMMANDS[command][0]
    monkeypatch.delitem(sys.modules, module, raising=False)  # restored afterwards
    monkeypatch.setattr(sys, "meta_path", [_CtrlCOnImport(module), *sys.meta_path])
    try:
        rc = main([command, "--help"])
    except KeyboardInterrupt:
        pytest.fail(f"a Ctrl-C while importing {module} escaped main (a traceback)")
    assert rc == 130
    assert capsys.readouterr().err.strip().splitlines() == ["iobench: interrupted"]
