"""Start iobench as a child process: argv from a config, immune to the working directory."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from iobench.core.errors import ConfigError

# A child Python must never import a folder named `iobench` in the current directory (a
# data root such as /lustre/$USER/iobench, or a source checkout) instead of the installed
# iobench, as `python -m` would. Python 3.11 has -P for that; before it, a one-line program
# drops sys.path[0] (the current directory, for -c) and runs the module.
HAS_DASH_P = sys.version_info >= (3, 11)
BOOTSTRAP = ("import runpy, sys; del sys.path[0]; "
             "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")


def python_argv(module: str = "iobench", dash_p: bool = HAS_DASH_P) -> list[str]:
    """`python -m MODULE` for a child, immune to its working directory (see above)."""
    if dash_p:
        return [sys.executable, "-P", "-m", module]
    return [sys.executable, "-c", BOOTSTRAP.format(module=module)]


TIMED_OUT = 124  # the exit status of a child killed at its time limit (as timeout(1) says)


def find_executable(name: str) -> str | None:
    """`name` resolved on PATH, or beside this Python (where the mpich extra puts mpiexec)."""
    found = shutil.which(name)
    if found is None and os.sep not in name:
        beside = Path(sys.executable).parent / name
        if beside.exists() and os.access(beside, os.X_OK):
            found = str(beside)
    return found


def require_launcher(launcher: tuple[str, ...]) -> str:
    """The launcher's program resolved (see `find_executable`); a ConfigError when absent,
    to be checked before anything runs."""
    name = launcher[0]
    found = find_executable(name)
    if found is None:
        raise ConfigError(f"launcher {name!r} is not an executable on PATH; install MPI (the "
                          "mpich extra) or name the launcher program (mpiexec, srun, ...), "
                          "e.g. 'srun -n {ranks}'")
    return found


@dataclass(frozen=True)
class Command:
    """`iobench NAME ARGS...` as a child process, under `launcher` when one is given.

    The launcher is a list of arguments, never a shell line; `{ranks}` in it becomes
    `ranks` and `{per_host}` becomes `ranks / hosts`.
    """

    name: str
    args: tuple[str, ...] = ()
    launcher: tuple[str, ...] = ()
    ranks: int = 1
    hosts: int = 1

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.hosts < 1 or self.ranks % self.hosts:
            raise ValueError(f"{self.ranks} ranks do not spread evenly over {self.hosts} hosts")

    def argv(self) -> list[str]:
        """The argument list to run (`require_launcher` says beforehand whether the launcher
        exists; here one that does not is left as named)."""
        cmd = [*python_argv(), self.name, *self.args]
        if not self.launcher:
            return cmd
        launcher = [a.replace("{ranks}", str(self.ranks))
                    .replace("{per_host}", str(self.ranks // self.hosts)) for a in self.launcher]
        launcher[0] = find_executable(launcher[0]) or launcher[0]
        return [*launcher, *cmd]


@dataclass(frozen=True)
class Finished:
    """How a child ended: its exit status (TIMED_OUT when killed at its limit) and its log."""

    code: int
    seconds: float
    log: Path
    timeout_s: float

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def timed_out(self) -> bool:
        return self.code == TIMED_OUT

    def why(self) -> str:
        """Why it failed, for a person: the time limit, or the exit status and the last line
        of its log (shown, never interpreted)."""
        if self.timed_out:
            return f"timed out after {self.timeout_s:.0f} s"
        return f"exit {self.code}: {last_line(self.log)}"


def last_line(log: Path, limit: int = 500) -> str:
    """The last non-empty line of a log, to show a person what the child said last."""
    try:
        text = log.read_text(errors="replace")
    except OSError as e:
        return f"no log ({e.strerror or e})"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else "no output"


@dataclass
class Child:
    """The running child (its process group), stoppable from a signal handler."""

    proc: subprocess.Popen[bytes] | None = None
    stopped: list[int] = field(default_factory=list)

    def stop(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stopped.append(signum)
            with contextlib.suppress(ProcessLookupError):  # mpiexec, ranks, their workers
                os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def run(argv: list[str], log: Path, timeout_s: float, *, child: Child | None = None,
        grace_s: float = 0.0) -> Finished:
    """Run `argv` in its own process group with its output in `log`.

    At `timeout_s` seconds the whole group (launcher, ranks, loader workers) is killed and
    the status is TIMED_OUT. An exception here (an interrupt) sends the group SIGTERM, waits
    up to `grace_s` seconds for it to write what it has, kills it, and is raised again.
    """
    child = child if child is not None else Child()
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(argv) + "\n")
        f.flush()
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        proc = child.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                             start_new_session=True, env=env)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            code = TIMED_OUT
        except BaseException:
            if grace_s > 0:
                child.stop(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace_s)
            child.kill()
            raise
        finally:
            child.proc = None
    return Finished(code, time.perf_counter() - t0, log, timeout_s)
