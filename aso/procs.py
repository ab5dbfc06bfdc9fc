"""The daemons ASO starts itself (the embedded store, the XRootD servers of the sites): start
them detached with a pid file, recognise them again, stop them and nobody else."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie is dead for our purpose (a child nobody reaped yet)


def pid_if_ours(pid_file: Path, ours: Callable[[list[str]], bool]) -> int | None:
    """The pid in `pid_file` if that process lives and its command line passes `ours` (a pid
    file can outlive its process, and the pid be reused by something else)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    argv = cmdline(pid)
    return pid if argv and ours(argv) and alive(pid) else None


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file` (made if missing) while starting or stopping a
    daemon: two starts at once (`aso run`'s watchdog and `aso storage start`, or two threads)
    would both find it not running, both spawn it, and leave the pid file naming the one that
    lost the port, while the other serves unrecognised. An flock ends with its holder, so a
    killed starter leaves no stale lock."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def spawn_detached(
    argv: Sequence[str],
    *,
    cwd: Path,
    output: Path,
    pid_file: Path,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a daemon in a session of its own (a Ctrl-C of the terminal does not reach it),
    its output appended to `output`, its pid written to `pid_file`."""
    with open(output, "ab") as out:
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pid_file.write_text(f"{process.pid}\n")
    return process


def reap(pid: int) -> None:
    """Collect the exit status of a daemon that is our own child, so no zombie remains."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def signal_group(pid: int, signum: int) -> None:
    """Signal a daemon and its process group (helpers it started): `spawn_detached` makes
    each daemon the leader of a session of its own."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        pass


def group_alive(pgid: int) -> bool:
    """Whether any live process is in process group `pgid` (a daemon's helpers outlive it and
    keep the sockets they inherited)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def kill_group(pid: int, timeout: float) -> bool:
    """SIGKILL a daemon and its process group (a frozen one heeds no other signal), and wait up
    to `timeout` seconds until none of them lives; whether they are gone."""
    signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while True:
        reap(pid)
        if not alive(pid) and not group_alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def terminate(pids: Sequence[int], timeout: float) -> None:
    """SIGTERM, then SIGKILL whatever still lives after `timeout` seconds; returns once they
    are gone (a process killed is not gone at once: a server started again on its ports right
    after found them taken)."""
    for pid in pids:
        signal_group(pid, signal.SIGTERM)
    _wait_gone(pids, timeout)
    for pid in pids:
        if alive(pid):
            signal_group(pid, signal.SIGKILL)
    _wait_gone(pids, 5.0)


def _wait_gone(pids: Sequence[int], timeout: float) -> None:
    """Wait up to `timeout` seconds until none of `pids` lives (reaping our children)."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in pids:
            reap(pid)
        if time.monotonic() >= deadline or not any(alive(pid) for pid in pids):
            return
        time.sleep(0.05)
