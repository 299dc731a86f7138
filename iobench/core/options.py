"""Validators of options that several commands share (`--repeat`, `--evict-cmd` with a warm cache)."""

from __future__ import annotations

from iobench.core.errors import ConfigError


def parse_repeat(repeat: int, of: str | None = None) -> int:
    """`repeat` when it is a whole number >= 1; else a ConfigError, saying what it counts
    (`of`: "cold repetitions of the grid", ...) when the command's help does not."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        if of is None:
            raise ConfigError(f"--repeat {repeat!r} must be >= 1")
        raise ConfigError(f"--repeat {repeat!r}: give the number of {of}, a whole number >= 1 "
                          "(5: median and spread, as in MLPerf Storage)")
    return repeat


def parse_evict_cmd(evict_cmd: str | None, warm: bool = False,
                    warm_option: str = "--warm-cache") -> str | None:
    """`evict_cmd` checked (`iobench.core.cache.parse_evict_cmd`), and refused beside `warm_option`:
    one empties caches before each cold read, the other asks for none."""
    from iobench.core.cache import parse_evict_cmd as parse_command

    parse_command(evict_cmd)
    if evict_cmd is not None and warm:
        raise ConfigError(f"--evict-cmd empties caches before each cold read; {warm_option} "
                          "asks for none: drop one of them")
    return evict_cmd
