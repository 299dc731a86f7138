"""The format registry (`iobench.core.formats`): the one place that names formats, cheap to
import, and complete for each format it lists."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from iobench.core.formats import FORMATS, format_table, parse_compression, parse_format

REPO = Path(__file__).resolve().parent.parent
# where a format's name may stand as a string: the registry, and its own writer and reader
OWNERS = {"iobench/core/formats.py"} | {f"{d}/{n}.py" for n in FORMATS for d in ("generators", "loaders")}
# strings that equal a format name but mean something else: a library (its version, for
# provenance), a preflight check's name, MLPerf's (DLIO's) own name of a workload's format
NOT_FORMATS = {("iobench/workflows/report.py", "hdf5"), ("iobench/workflows/report.py", "lmdb"),
               ("iobench/core/sysinfo.py", "hdf5"), ("iobench/core/sysinfo.py", "zarr"),
               ("iobench/core/sysinfo.py", "lmdb"),  # the Python package, for its version
               ("iobench/workflows/preflight.py", "files"),
               ("iobench/core/workloads.py", "npz")}


def _format_strings(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each string constant equal to a format name, outside dict keys,
    subscripts and `.get`/`.pop` keys (`doc["files"]` is a key, not a format)."""
    tree = ast.parse(path.read_text())
    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys |= {id(k) for k in node.keys if k is not None}
        elif isinstance(node, ast.Subscript):
            keys.add(id(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "pop", "setdefault") and node.args:
            keys.add(id(node.args[0]))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value in FORMATS and id(node) not in keys]


def test_no_module_but_the_registry_names_a_format():
    found = []
    for top in ("iobench", "generators", "loaders"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel in OWNERS:
                continue
            found += [f"{rel}:{line}: {name!r}" for line, name in _format_strings(path)
                      if (rel, name) not in NOT_FORMATS]
    assert not found, "format names outside iobench/core/formats.py (read them from FORMATS):\n" + \
        "\n".join(found)


def test_the_check_sees_a_format_name():
    src = 'x = fmt == "hdf5"\ny = {"files": 1}\nz = d["lmdb"] + d.get("npz")\n'
    path = REPO / "tests" / "_probe_formats.py"
    try:
        path.write_text(src)
        assert _format_strings(path) == [(1, "hdf5")]
    finally:
        path.unlink()


def test_importing_the_registry_and_the_cli_loads_no_format_library():
    code = ("import sys, iobench.core.formats, iobench.cli; "
            "print(sorted(m for m in ('h5py', 'netCDF4', 'zarr', 'lmdb', 'torch', 'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_entry_resolves_to_its_writer_reader_and_loader(name):
    spec = FORMATS[name]
    assert spec.name == name and spec.compressions[0] == "none"
    assert spec.writer_class().format == name
    assert spec.reader_class().format == name
    assert spec.loader_class().reader_cls is spec.reader_class()
    assert spec.writer.startswith(f"iobench.generators.{name}:")
    assert spec.reader.startswith(f"iobench.loaders.{name}:")


def test_errors_name_the_value_and_the_choices():
    from iobench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown format 'tfrecord'; choose one of: hdf5"):
        parse_format("tfrecord")
    with pytest.raises(ConfigError, match="'lzf' is not available for the netcdf format"):
        parse_compression("netcdf", "lzf")
    with pytest.raises(ConfigError, match="JPEG bytes are already compressed"):
        parse_compression("zarr", "zstd", "jpeg")


def test_the_docs_format_table_is_the_registry():
    assert format_table() in (REPO / "docs" / "design.md").read_text()


def test_user_data_suffixes_come_from_the_registry():
    """`--data` detection (iobench/core/userdata.py) takes its suffixes from `user_suffixes`."""
    from iobench.core.formats import user_format
    from iobench.core.userdata import H5_SUFFIXES, _file_kind

    assert [user_format(s) for s in (".HDF5", ".nc4", ".mdb", ".jpeg", ".npz")] == \
        ["hdf5", "netcdf", "lmdb", "files", None]
    assert FORMATS["hdf5"].user_suffixes == H5_SUFFIXES
    assert _file_kind(Path("x.he5")) == "hdf5" and _file_kind(Path("missing.jpg")) == "other"
