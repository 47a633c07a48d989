"""Name how a vLLM process died: a vLLM general plugin, on only under ``agentclaims vllm serve``.

When a worker dies, vLLM's engine core logs ``Worker proc VllmWorker-0 died unexpectedly
(exit code: None)``: its monitor wakes on the process's sentinel, often before the exit
status is known, so the signal (SIGILL from an illegal instruction, SIGKILL from the
out-of-memory killer or an operator) is lost. This plugin runs a small thread in each vLLM
process that finds the vLLM children it starts (the API server's engine core, the engine
core's workers) and waits on each with ``waitid(..., WNOWAIT)``, which reads the exit status
and leaves the child for vLLM to reap as before. That thread can lose the race to vLLM's own
reaping (its monitor joins the dead worker at once), so the reaping says it too: vLLM reaps
its children through ``multiprocessing`` (``Popen.poll``, ``os.waitpid``), and the plugin
wraps that call to log the status it reaped. It logs one line per child that ended::

    agentclaims: vLLM process VLLM::Worker (pid 2886) ended by signal SIGILL (4)

``agentclaims vllm serve`` reads that line and says it when it stops. The plugin is on only
where ``AGENTCLAIMS_VLLM_WATCH=1`` is set (``agentclaims vllm serve`` sets it); it changes
nothing vLLM sees (``poll`` answers as before).
"""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

__all__ = ["ENV", "LINE", "describe", "describe_code", "register", "watch_reaping"]

ENV = "AGENTCLAIMS_VLLM_WATCH"
LINE = re.compile(
    r"agentclaims: vLLM process (?P<name>\S+) \(pid (?P<pid>\d+)\) ended by "
    r"(?:signal (?P<signal>SIG\w+) \((?P<signo>\d+)\)|exit status (?P<status>\d+))"
)
"""The line this plugin logs, as ``agentclaims vllm serve`` reads it."""
_POLL_S = 0.2


def describe(status: os.waitid_result) -> str:
    """``signal SIGILL (4)`` or ``exit status 1``: how a child ended."""
    if status.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        try:
            name = signal.Signals(status.si_status).name
        except ValueError:
            name = f"SIG{status.si_status}"
        return f"signal {name} ({status.si_status})"
    return f"exit status {status.si_status}"


def _children() -> list[tuple[int, str]]:
    """This process's children that vLLM named (``VLLM::...``): (pid, name)."""
    me, found = os.getpid(), []
    for task in Path(f"/proc/{me}/task").glob("*/children"):
        try:
            pids = task.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if name.startswith("VLLM::"):
                found.append((int(pid), name))
    return found


_NAMES: dict[int, str] = {}
"""The vLLM children the watch has found: pid -> name."""
_REPORTED: set[int] = set()
_LOCK = threading.Lock()


def describe_code(code: int) -> str:
    """``describe``'s words for a ``multiprocessing`` exit code (a signal is its negative)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"SIG{-code}"
        return f"signal {name} ({-code})"
    return f"exit status {code}"


def _report(pid: int, how: str, clean: bool) -> None:
    """Log how child ``pid`` ended, once (the waiting thread and the reaping may both see it)."""
    with _LOCK:
        if pid in _REPORTED or pid not in _NAMES:
            return
        _REPORTED.add(pid)
    try:
        from vllm.logger import init_logger

        log = init_logger("vllm.plugins.agentclaims_watch")
    except ImportError:  # outside vLLM (its tests)
        import logging

        log = logging.getLogger("vllm.plugins.agentclaims_watch")
    (log.info if clean else log.error)(
        "agentclaims: vLLM process %s (pid %d) ended by %s", _NAMES[pid], pid, how
    )


def _await_exit(pid: int) -> None:
    """Block until child ``pid`` ends; log how. ``WNOWAIT`` leaves it for vLLM to reap: the
    kernel wakes this call as the child exits, before vLLM's own monitor has looked."""
    try:
        status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # reaped by vLLM first: its reaping told (``watch_reaping``)
        return
    if status is not None:
        clean = status.si_code == os.CLD_EXITED and not status.si_status
        _report(pid, describe(status), clean)


def watch_reaping() -> None:
    """Wrap ``multiprocessing``'s reaping (``Popen.poll``) in this process so that a child the
    watch found is reported with the status vLLM reaped (once; idempotent)."""
    from multiprocessing import popen_fork

    poll = popen_fork.Popen.poll
    if getattr(poll, "agentclaims_watch", False):
        return

    def reaping_poll(self: Any, flag: int = os.WNOHANG) -> int | None:
        was = self.returncode
        code: int | None = poll(self, flag)
        if was is None and code is not None:
            _report(self.pid, describe_code(code), code == 0)
        return code

    reaping_poll.agentclaims_watch = True  # type: ignore[attr-defined]
    popen_fork.Popen.poll = reaping_poll  # type: ignore[method-assign]


def _watch() -> None:
    """Every ``_POLL_S``: a waiting thread for each new vLLM child."""
    while True:
        for pid, name in _children():
            if pid not in _NAMES:
                _NAMES[pid] = name
                threading.Thread(
                    target=_await_exit, args=(pid,), name=f"agentclaims-wait-{pid}", daemon=True
                ).start()
        threading.Event().wait(_POLL_S)


def register() -> None:
    """vLLM's entry point (``vllm.general_plugins``): start the watch where it is asked for."""
    if os.environ.get(ENV) != "1" or not Path("/proc/self/task").is_dir():
        return
    watch_reaping()
    threading.Thread(target=_watch, name="agentclaims-watch", daemon=True).start()
