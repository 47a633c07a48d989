"""Name how a vLLM process died: a vLLM general plugin, on only under ``agentclaims vllm serve``.

When a worker dies, vLLM's engine core logs ``Worker proc VllmWorker-0 died unexpectedly
(exit code: None)``: its monitor wakes on the process's sentinel, often before the exit
status is known, so the signal (SIGILL from an illegal instruction, SIGKILL from the
out-of-memory killer or an operator) is lost. This plugin runs a small thread in each vLLM
process that finds the vLLM children it starts (the API server's engine core, the engine
core's workers) and waits on each with ``waitid(..., WNOWAIT)``, which reads the exit status
and leaves the child for vLLM to reap as before. It logs one line per child that ended::

    agentclaims: vLLM process VLLM::Worker (pid 2886) ended by signal SIGILL (4)

``agentclaims vllm serve`` reads that line and says it when it stops. The plugin is on only
where ``AGENTCLAIMS_VLLM_WATCH=1`` is set (``agentclaims vllm serve`` sets it); it changes
nothing in vLLM.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

__all__ = ["ENV", "LINE", "describe", "register"]

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


def _await_exit(pid: int, name: str) -> None:
    """Block until child ``pid`` ends; log how. ``WNOWAIT`` leaves it for vLLM to reap: the
    kernel wakes this call as the child exits, before vLLM's own monitor has looked."""
    from vllm.logger import init_logger

    log = init_logger("vllm.plugins.agentclaims_watch")  # before the wait: the wake only logs
    try:
        status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # reaped by vLLM before this thread began to wait
        return
    if status is None:
        return
    clean = status.si_code == os.CLD_EXITED and not status.si_status
    (log.info if clean else log.error)(
        "agentclaims: vLLM process %s (pid %d) ended by %s", name, pid, describe(status)
    )


def _watch() -> None:
    """Every ``_POLL_S``: a waiting thread for each new vLLM child."""
    known: set[int] = set()
    while True:
        for pid, name in _children():
            if pid not in known:
                known.add(pid)
                threading.Thread(
                    target=_await_exit,
                    args=(pid, name),
                    name=f"agentclaims-wait-{pid}",
                    daemon=True,
                ).start()
        threading.Event().wait(_POLL_S)


def register() -> None:
    """vLLM's entry point (``vllm.general_plugins``): start the watch where it is asked for."""
    if os.environ.get(ENV) != "1" or not Path("/proc/self/task").is_dir():
        return
    threading.Thread(target=_watch, name="agentclaims-watch", daemon=True).start()
