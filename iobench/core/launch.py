"""Every child process iobench starts: its own process group, a time limit, a bounded output.

Two ways to run one, both governed the same way: `run` (an iobench child, its output in a log
file) and `capture` (a site's command, fio, fusermount: the end of its output kept in memory).
Each child runs in a process group of its own (a new session), with stdin closed; at its time
limit the whole group is killed, and when the child exits, whatever it left running in its group
(`cmd &`, a loader worker) is killed too, before the child is reaped, so its group id cannot have
been reused. `capture` never waits for the end of a pipe that a process outside the group still
holds: once the child has exited it reads for at most DRAIN_S more. Only the last
OUTPUT_TAIL_BYTES of each stream are kept, so a command that prints 10 MB is a short message.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iobench.core.errors import ConfigError, StorageError

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
    """The last non-empty line of a log (read from its last OUTPUT_TAIL_BYTES), to show a
    person what the child said last."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - OUTPUT_TAIL_BYTES))
            text = f.read(OUTPUT_TAIL_BYTES).decode(errors="replace")
    except OSError as e:
        return f"no log ({e.strerror or e})"
    return last_line_of(text, limit)


def last_line_of(text: str, limit: int = 500) -> str:
    """The last non-empty line of `text`, at most `limit` characters (its end: a line that
    long is usually a message at the end of a dump)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "no output"
    line = lines[-1]
    return line if len(line) <= limit else "..." + line[len(line) - limit + 3:]


# ---------------------------------------------------------------- the process group

#: the end of each output stream a child's message and result keep (bytes)
OUTPUT_TAIL_BYTES = 4096
#: after a child has exited, how long `capture` still reads pipes that a process outside its
#: group may hold (seconds)
DRAIN_S = 1.0


def _exited(pid: int) -> bool:
    """Whether child `pid` has exited, without reaping it (its group id stays reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped
        return True


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux >= 5.3), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def wait_exit(pid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` seconds for child `pid` to exit, without reaping it; whether it
    did."""
    deadline = time.monotonic() + timeout_s
    fd = _pidfd(pid)
    try:
        while not _exited(pid):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if fd is not None:
                select.select([fd], [], [], left)
            else:
                time.sleep(min(left, 0.05))
        return True
    finally:
        if fd is not None:
            os.close(fd)


def kill_group(pid: int, signum: int = signal.SIGKILL) -> None:
    """Send `signum` to the process group that child `pid` leads (gone already: nothing)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def start(argv: Sequence[str] | str, *, stdout: int | Any = None, stderr: int | Any = None,
          env: Mapping[str, str] | None = None, shell: bool = False) -> subprocess.Popen[bytes]:
    """`argv` started in a process group (a session) of its own, with stdin closed."""
    return subprocess.Popen(argv, shell=shell, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=stderr, start_new_session=True,
                            env=None if env is None else dict(env), close_fds=True)


def end(proc: subprocess.Popen[bytes]) -> None:
    """Kill what is left of `proc`'s group (everything, or what an exited child left behind),
    then reap the child."""
    if proc.returncode is None:
        kill_group(proc.pid)
    proc.wait()


@dataclass
class Child:
    """The running child (its process group), stoppable from a signal handler."""

    proc: subprocess.Popen[bytes] | None = None
    stopped: list[int] = field(default_factory=list)

    def stop(self, signum: int) -> None:
        # never poll() here: reaping the child would free its group id under `run`
        if self.proc is not None and self.proc.returncode is None:
            self.stopped.append(signum)
            kill_group(self.proc.pid, signum)  # mpiexec, ranks, their workers

    def kill(self) -> None:
        if self.proc is not None:
            end(self.proc)


def run(argv: list[str], log: Path, timeout_s: float, *, child: Child | None = None,
        grace_s: float = 0.0) -> Finished:
    """Run `argv` in its own process group with its output in `log`.

    At `timeout_s` seconds the whole group (launcher, ranks, loader workers) is killed and
    the status is TIMED_OUT; when the child exits, what it left in its group is killed. An
    exception here (an interrupt) sends the group SIGTERM, waits up to `grace_s` seconds for
    it to write what it has, kills it, and is raised again. A log that cannot be written (a
    full disk) is a StorageError before anything runs.
    """
    child = child if child is not None else Child()
    t0 = time.perf_counter()
    with _open_log(log, argv) as f:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        proc = child.proc = start(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            exited = wait_exit(proc.pid, timeout_s)
        except BaseException:
            if grace_s > 0:
                child.stop(signal.SIGTERM)
                wait_exit(proc.pid, grace_s)
            raise
        finally:
            child.kill()
            child.proc = None
    code = proc.returncode if exited else TIMED_OUT
    return Finished(code, time.perf_counter() - t0, log, timeout_s)


def _open_log(log: Path, argv: list[str]) -> Any:
    """`log` opened for a child's output, the command line first; a StorageError naming it
    when it cannot be made or written (a full disk, a read-only folder)."""
    f = None
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        f = open(log, "wb", buffering=0)  # noqa: SIM115 (the caller's with closes it)
        f.write(("$ " + shlex.join(argv) + "\n").encode())
    except OSError as e:
        if f is not None:
            f.close()
        raise StorageError(f"cannot write the child's log {log} ({e.strerror or e}); free "
                           "space there or choose another --results folder") from e
    return f


# ---------------------------------------------------------------- a command's output, captured

@dataclass(frozen=True)
class Captured:
    """How a command run by `capture` ended: its exit status (None: it could not start, or ran
    past its limit), its run time (seconds), and the end of each output stream (at most
    `keep_bytes`; `truncated` when more was printed)."""

    code: int | None
    seconds: float
    stdout: str
    stderr: str
    timed_out: bool = False
    error: str | None = None  # why it could not start
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.code == 0

    def last_line(self, limit: int = 300) -> str:
        """What it said last, for a person: its last line on stderr, else on stdout, or why it
        did not finish (never more than `limit` characters)."""
        if self.error is not None:
            return self.error
        said = last_line_of(self.stderr or self.stdout, limit)
        return said if self.stderr.strip() or self.stdout.strip() else ""


class _Tail:
    """The last `keep` bytes of a stream."""

    def __init__(self, keep: int) -> None:
        self.keep, self.data, self.dropped = keep, bytearray(), False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.keep:
            del self.data[:len(self.data) - self.keep]
            self.dropped = True

    def text(self) -> str:
        return self.data.decode(errors="replace")


def capture(argv: Sequence[str] | str, timeout_s: float, *, shell: bool = False,
            env: Mapping[str, str] | None = None,
            keep_bytes: int = OUTPUT_TAIL_BYTES) -> Captured:
    """Run `argv` (a shell line with `shell`) in its own process group, keeping the last
    `keep_bytes` of its stdout and stderr; see the module's docstring for the rules.

    Never raises for the command's sake: one that cannot start has `error`, one that runs past
    `timeout_s` seconds is killed with its group and has `timed_out`.
    """
    t0 = time.perf_counter()
    try:
        proc = start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                     shell=shell)
    except OSError as e:
        return Captured(None, time.perf_counter() - t0, "", "",
                        error=f"cannot run it: {e.strerror or e}")
    out, err = _Tail(keep_bytes), _Tail(keep_bytes)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        exited = _pump(proc, {proc.stdout.fileno(): out, proc.stderr.fileno(): err},
                       time.monotonic() + timeout_s)
    finally:
        end(proc)
        proc.stdout.close()
        proc.stderr.close()
    return Captured(proc.returncode if exited else None, time.perf_counter() - t0, out.text(),
                    err.text(), timed_out=not exited, truncated=out.dropped or err.dropped)


def _pump(proc: subprocess.Popen[bytes], tails: dict[int, _Tail], deadline: float) -> bool:
    """Read the pipes into their tails until the child has exited and they are closed (at
    most DRAIN_S after its exit: what it left in its group is killed then) or until the
    deadline; whether the child exited."""
    exited, until = False, deadline
    with selectors.DefaultSelector() as sel:
        for fd in tails:
            sel.register(fd, selectors.EVENT_READ)
        while True:
            left = until - time.monotonic()
            if not exited and (_exited(proc.pid) or (
                    not sel.get_map() and wait_exit(proc.pid, max(left, 0.0)))):
                exited, until = True, time.monotonic() + DRAIN_S
                kill_group(proc.pid)  # `cmd &` and the like: their pipes close with them
                left = DRAIN_S
            if (exited and not sel.get_map()) or left <= 0:
                return exited
            for key, _ in sel.select(min(left, 0.05)):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    tails[key.fd].add(chunk)
                else:
                    sel.unregister(key.fd)
