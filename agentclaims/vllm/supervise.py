"""``agentclaims vllm serve``'s watch over the vLLM server it starts.

vLLM's ``/health`` answers before its engine has run a single step, and a dead engine is, to a
client, an HTTP 500 followed by a closed port. The supervisor makes both explicit:

- **Ready means served.** After ``/health`` answers, one real completion goes through the
  engine (one prompt token, one generated: shorter than a block, so nothing is cached). Only
  then does it print ``agentclaims vllm: ready ...``. A server whose engine cannot run (a
  worker killed by SIGILL on a CPU with AMX, say) never says it is ready.
- **A death is named.** vLLM's output passes through line by line. The lines that tell why
  the engine died are kept: the ``agentclaims_vllm.watch`` plugin's (which process, which
  signal), vLLM's own (``Worker proc ... died unexpectedly``, ``EngineCore encountered a
  fatal error``) and Python's fault handler's (``Fatal Python error: Illegal instruction``).
  When vLLM stops without being asked, the supervisor exits 1 with one message naming them.
- **The gateway hears it too.** The state (``starting``, ``ready``, ``dead`` with its reason
  and signal, ``stopped``) is written as JSON beside the KV events endpoint
  (``state_path``), where a gateway on the same host (it already reads that endpoint) finds
  it and names the signal in its 503.

SIGTERM or SIGINT stops vLLM (SIGTERM to it, then SIGKILL to its processes after
``stop_timeout_s``) and exits 0; a supervisor killed outright takes vLLM with it (vLLM gets
SIGTERM: Linux's parent-death signal). Standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = ["DeathCause", "Supervisor", "descendants", "read_state", "state_path"]

EXIT_DIED = 1
"""The exit status when vLLM stopped without being asked (at start or later)."""

_WATCH = re.compile(
    r"agentclaims: vLLM process (?P<name>\S+) \(pid (?P<pid>\d+)\) ended by "
    r"(?:signal (?P<signal>SIG\w+) \(\d+\)|exit status (?P<status>\d+))"
)
"""``agentclaims_vllm.watch.LINE`` (the connector's distribution is not importable here)."""
_WORKER_DIED = re.compile(
    r"Worker proc (?P<name>\S+) died unexpectedly \(exit code: (?P<code>-?\d+|None)"
)
"""vLLM's own line, when its monitor saw the exit status (a signal is its negative)."""
_FAULTS = {
    "Illegal instruction": "SIGILL",
    "Segmentation fault": "SIGSEGV",
    "Floating point exception": "SIGFPE",
    "Bus error": "SIGBUS",
    "Aborted": "SIGABRT",
}
"""Python's fault handler's words for the signals it reports (``PYTHONFAULTHANDLER=1``)."""
_VLLM_REASONS = (
    re.compile(r"Worker proc \S+ died unexpectedly \(exit code: [^)]*\)"),
    re.compile(r"Engine core proc \S+ died unexpectedly"),
    re.compile(r"Fatal Python error: [^\r\n]+"),
    re.compile(r"EngineCore encountered a fatal error"),
    re.compile(r"EngineDeadError"),
)


def state_path(kv_events: str) -> Path:
    """Where ``agentclaims vllm serve`` writes its state for the vLLM whose KV events are on
    ``kv_events`` (``ipc:///DIR/NAME`` -> ``/DIR/NAME.state.json``)."""
    return Path(kv_events.removeprefix("ipc://") + ".state.json")


def read_state(kv_events: str) -> dict[str, Any] | None:
    """The supervisor's last state for that vLLM, or ``None`` (none written, or unreadable)."""
    try:
        data = json.loads(state_path(kv_events).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class DeathCause:
    """What vLLM's processes said as they died, in the order they said it.

    The death is named after the first process that ended badly (the watch plugin's line, an
    orphan the supervisor reaped, vLLM's own exit code), with one exception: once vLLM's
    monitor says a worker "died unexpectedly", the death began there, and what follows (vLLM
    tearing down its engine core with SIGTERM, the supervisor stopping the rest) is its
    consequence. The cause is then the worker's end, or no signal at all if none names it."""

    lines: list[str] = field(default_factory=list)
    """vLLM's own reasons (at most one of each kind)."""
    worker_died: bool = False
    """vLLM's monitor saw a worker die unexpectedly."""
    _ends: list[_End] = field(default_factory=list, repr=False)
    _fault: str | None = field(default=None, repr=False)
    _kinds: set[int] = field(default_factory=set, repr=False)

    @property
    def signal(self) -> str | None:
        """The signal the death began with (``SIGILL``): from the watch plugin's line, else
        vLLM's own exit code, else an orphan's status, else Python's fault handler (the watch
        may lose the race to vLLM's own reaping of the child)."""
        end = self._cause()
        return end.signal if end is not None and end.signal else self._fault

    @property
    def process(self) -> str | None:
        """Which process (``VLLM::Worker (pid 2886)``)."""
        end = self._cause()
        return None if end is None else end.process

    def _cause(self) -> _End | None:
        ends = (  # what a teardown did after a worker's death, or a stop, names nothing
            [e for e in self._ends if e.worker]
            if self.worker_died
            else [e for e in self._ends if not e.stopping]
        )
        return next((e for e in ends if e.signal), ends[0] if ends else None)

    def orphan(self, name: str, pid: int, signame: str) -> None:
        """A vLLM process the supervisor saw end (an orphan it reaped, or a zombie not yet
        reaped by its parent) ended by ``signame``."""
        process = f"{name} (pid {pid})"
        if all(e.process != process for e in self._ends):  # a zombie is seen until reaped
            self._ends.append(_End(signame, process, _is_worker(name), False))

    def read(self, line: str, *, stopping: bool = False) -> bool:
        """Keep what ``line`` tells of a death; whether it told anything. ``stopping``: the
        supervisor is stopping vLLM (the ends it causes name nothing, unless a worker's)."""
        told = False
        if (m := _WATCH.search(line)) is not None and (m["signal"] or m["status"] != "0"):
            process = f"{m['name']} (pid {m['pid']})"
            self._ends.append(_End(m["signal"], process, _is_worker(m["name"]), stopping))
            told = True
        if (w := _WORKER_DIED.search(line)) is not None and not stopping:
            self.worker_died = True
            with contextlib.suppress(ValueError):  # the watch lost the race to vLLM's reaping
                if (code := int(w["code"])) < 0:
                    self._ends.append(_End(signal.Signals(-code).name, w["name"], True, False))
        fault = line.partition("Fatal Python error: ")[2].strip()
        if self._fault is None and fault in _FAULTS:
            self._fault = _FAULTS[fault]
        for kind, pattern in enumerate(_VLLM_REASONS):
            if (r := pattern.search(line)) is not None:
                if kind not in self._kinds:  # each kind once: a traceback repeats itself
                    self._kinds.add(kind)
                    self.lines.append(r.group(0))
                told = True
        return told

    @property
    def known(self) -> bool:
        return bool(self.signal or self.process or self.lines)

    def __str__(self) -> str:
        signame, process = self.signal, self.process
        head = (
            f"vLLM's {process or 'process'} was killed by {signame}"
            if signame
            else f"vLLM's {process} exited with an error"
            if process
            else "vLLM's engine died"
        )
        return head + (f" (vLLM: {'; '.join(self.lines)})" if self.lines else "")


@dataclass(frozen=True)
class _End:
    """One vLLM process that ended badly, as the supervisor learned it."""

    signal: str | None  # None: an error exit status
    process: str
    worker: bool
    stopping: bool  # seen while the supervisor stopped vLLM


def _is_worker(name: str) -> bool:
    return name.startswith(("VLLM::Worker", "VllmWorker"))


class Supervisor:
    """Run vLLM (``argv``, ``env``), say when it is ready, name how it died."""

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        *,
        url: str,
        kv_events: str,
        ready_timeout_s: float = 900.0,
        stop_timeout_s: float = 60.0,
        out: IO[str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = {**env, "AGENTCLAIMS_VLLM_WATCH": "1", "PYTHONFAULTHANDLER": "1"}
        self.url = url.rstrip("/")
        self.state_file = state_path(kv_events)
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.out = out or sys.stdout
        self.cause = DeathCause()
        self._stop = threading.Event()
        self._ended = threading.Event()
        self._ready = threading.Event()
        self._stopping = threading.Event()
        """Set once the supervisor stops vLLM itself: the signals that stop brings are its own."""
        self._watched: dict[int, str] = {}
        """vLLM's processes once it is ready (pid -> name): a worker killed shows its signal
        in ``/proc`` while it waits for its parent to reap it."""
        self._proc: subprocess.Popen[str] | None = None
        self.late: str | None = None
        """Why vLLM was not ready within ``ready_timeout_s`` (it is stopped then), if so."""

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        """Until vLLM stops: 0 after a stop that was asked for, ``EXIT_DIED`` otherwise."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        _become_subreaper()
        self._write_state("starting")
        self._proc = proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            preexec_fn=_die_with_parent,
        )
        self._write_state("starting", pid=proc.pid)
        reader = threading.Thread(target=self._relay, args=(proc,), daemon=True)
        reader.start()
        reaper = threading.Thread(target=self._reap_orphans, args=(proc,), daemon=True)
        reaper.start()
        ready = self._await_ready(proc)
        if ready is not None:
            self._say(
                f"ready: one completion served by the engine in {ready * 1000:.0f} ms, "
                f"{self.url}/v1"
            )
            self._write_state("ready", pid=proc.pid)
            self._ready.set()
        while proc.poll() is None and not self._stop.is_set() and self.late is None:
            if self.cause.known:  # the engine died; vLLM's API server closes within seconds
                settle = time.monotonic() + 3.0  # the watch's line (the signal) comes apace
                while self.cause.signal is None and time.monotonic() < settle:
                    self._stop.wait(0.05)
                self._write_state(
                    "dead", pid=proc.pid, reason=str(self.cause), signal=self.cause.signal
                )
                self._stop_vllm(proc, grace_s=10.0)
                break
            self._stop.wait(0.2)
        if self.late is not None:
            self._say(f"{self.late}: stopping it")
        if self._stop.is_set() or self.late is not None:
            self._stop_vllm(proc, grace_s=self.stop_timeout_s)
        proc.wait()
        reader.join(timeout=5.0)
        self._end_leftovers()
        self._ended.set()
        reaper.join(timeout=5.0)
        if self._stop.is_set() and not self.cause.known and self.late is None:
            self._write_state("stopped", pid=proc.pid)
            self._say("stopped")
            return 0
        if self.late is not None:
            self._write_state("dead", pid=proc.pid, reason=self.late, signal=None)
            self._say(f"{self.late}; stopped it (exit status {proc.returncode})")
            return EXIT_DIED
        reason, signame = str(self.cause), self.cause.signal
        if not self.cause.known:
            reason, signame = _own_end(proc)
        when = "before it was ready" if ready is None else "while serving"
        self._write_state("dead", pid=proc.pid, reason=reason, signal=signame)
        self._say(f"vLLM died {when} (exit status {proc.returncode}): {reason}")
        return EXIT_DIED

    def _end_leftovers(self, grace_s: float = 15.0) -> None:
        """Stop what vLLM's API server left running as it ended (its engine core and workers,
        orphaned to this subreaper when the server was killed outright): SIGTERM, then SIGKILL
        after ``grace_s``. Their ends are this stop's, never a cause."""
        me = os.getpid()
        left = _live_descendants(me)
        if not left:
            return
        self._stopping.set()
        names = ", ".join(f"{name} (pid {pid})" for pid, name in sorted(left.items()))
        self._say(f"vLLM's API server has ended: stopping what it left running: {names}")
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while (left := _live_descendants(me)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stopping.set()  # what follows is a stop asked for: its signals name no death
        if not self._stop.is_set():
            self._say(f"signal {signum}: stopping vLLM")
        self._stop.set()

    def _relay(self, proc: subprocess.Popen[str]) -> None:
        """vLLM's output, passed through; the lines that name a death kept."""
        assert proc.stdout is not None
        for line in proc.stdout:
            self.out.write(line)
            self.out.flush()
            if not self._stop.is_set():  # a stop asked for: its lines name no death
                self.cause.read(line, stopping=self._stopping.is_set())

    def _reap_orphans(self, proc: subprocess.Popen[str]) -> None:
        """The supervisor is a child subreaper: a vLLM process whose parent died before
        reaping it (a worker killed as its engine core is torn down) becomes its child. Reap
        such orphans (never vLLM itself, which ``Popen`` waits for), keeping the signal one
        died by: the watch plugin's line can lose that race.

        Each of vLLM's processes is also watched through a pidfd, readable the instant the
        process ends: its signal is read from ``/proc`` while it is a zombie, before its
        parent's reaping (which the watch plugin's ``waitid`` can lose to) takes it away."""
        me = os.getpid()
        poller, fds = select.poll(), {}  # pidfd -> (pid, name)
        try:
            for tick in itertools.count():
                if not self._watched and self._ready.is_set():
                    self._watched = descendants(proc.pid)
                    fds = _pidfds(self._watched)
                    for fd in fds:
                        poller.register(fd, select.POLLIN)
                for fd, _ in poller.poll(50):  # a watched process ended (or: 50 ms passed)
                    poller.unregister(fd)
                    pid, name = fds[fd]
                    if (signame := _signal_of_zombie(pid)) is not None:
                        self._orphan(name, pid, signame)
                # every tick too, pidfd or not: a pidfd wakes as the last thread exits, and the
                # zombie it leaves may need another look before /proc shows its status
                for pid, name in self._watched.items():  # ended, not reaped yet by its parent
                    if (signame := _signal_of_zombie(pid)) is not None:
                        self._orphan(name, pid, signame)
                orphans = _zombie_children(me) if tick % 10 == 0 else {}  # all of /proc: seldom
                for pid, name in orphans.items():
                    if pid == proc.pid:
                        continue
                    try:
                        info = os.waitid(os.P_PID, pid, os.WEXITED)
                    except ChildProcessError:
                        continue
                    if info is not None and info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
                        with contextlib.suppress(ValueError):
                            self._orphan(name, pid, signal.Signals(info.si_status).name)
                if self._ended.is_set():
                    return
        finally:
            for fd in fds:
                os.close(fd)

    def _orphan(self, name: str, pid: int, signame: str) -> None:
        """A vLLM process ended by ``signame``: a cause, unless the supervisor's own stop
        brought it (a signal of that stop tells nothing)."""
        if not self._stopping.is_set():
            self.cause.orphan(name, pid, signame)

    def _await_ready(self, proc: subprocess.Popen[str]) -> float | None:
        """``/health``, then one completion; its time, or ``None`` if vLLM died (or was
        stopped) first, or ``ready_timeout_s`` passed."""
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None or self._stop.is_set() or self.cause.known:
                return None
            if self._get("/health") == 200:
                break
            self._stop.wait(0.5)
        else:
            self.late = (
                f"vLLM was not healthy within {self.ready_timeout_s:g} s (--ready-timeout-s)"
            )
            return None
        start = time.monotonic()
        try:
            models = json.loads(self._request("/v1/models")[1] or b"{}")
            model = models["data"][0]["id"]
            status, body = self._request(
                "/v1/completions",
                {"model": model, "prompt": [1], "max_tokens": 1, "temperature": 0},
                timeout_s=max(1.0, deadline - time.monotonic()),
            )
        except (OSError, ValueError, KeyError, IndexError) as exc:
            if time.monotonic() >= deadline and proc.poll() is None:
                self.late = (
                    f"vLLM served no completion within {self.ready_timeout_s:g} s "
                    "(--ready-timeout-s)"
                )
                return None
            status, body = 0, repr(exc).encode()
        if status != 200:
            self.cause.lines.append(
                f"the first completion answered HTTP {status}: {body[:300].decode(errors='replace')}"
            )
            return None
        return time.monotonic() - start

    def _stop_vllm(self, proc: subprocess.Popen[str], *, grace_s: float) -> None:
        self._stopping.set()
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._say(f"vLLM did not stop within {grace_s:.0f} s: killing its processes")
            with contextlib.suppress(ProcessLookupError):
                for pid in descendants(proc.pid):
                    os.kill(pid, signal.SIGKILL)
                proc.kill()

    # ------------------------------------------------------------------ plumbing
    def _get(self, path: str) -> int:
        try:
            return self._request(path, timeout_s=2.0)[0]
        except OSError:
            return 0

    def _request(
        self, path: str, body: dict[str, Any] | None = None, *, timeout_s: float = 10.0
    ) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def _write_state(self, state: str, **data: Any) -> None:
        record = {"state": state, "url": self.url, "at": time.time(), **data}
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(record), encoding="utf-8")
            tmp.replace(self.state_file)

    def _say(self, message: str) -> None:
        print(f"agentclaims vllm: {message}", file=sys.stderr, flush=True)


def _prctl(option: int, value: int) -> None:
    """Linux's ``prctl(option, value)``; nothing where there is none."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _die_with_parent() -> None:
    """In vLLM's process, before it starts: SIGTERM when the supervisor dies (even by
    ``kill -9``), so no vLLM outlives the command that started it (``PR_SET_PDEATHSIG``)."""
    _prctl(1, int(signal.SIGTERM))


def _become_subreaper() -> None:
    """Orphaned descendants (vLLM's processes whose parent died) are reparented to this
    process, not to init, so their deaths can be read (``PR_SET_CHILD_SUBREAPER``)."""
    _prctl(36, 1)


def _stat(pid: int | str) -> tuple[str, list[str]] | None:
    """``/proc/PID/stat``: the process's name and the fields after it (state first), or
    ``None`` once it is gone."""
    try:
        head, _, tail = Path(f"/proc/{pid}/stat").read_text().rpartition(")")
    except OSError:
        return None
    return head.partition("(")[2], tail.split()


def _processes() -> Iterator[tuple[int, str, list[str]]]:
    """Every process: its pid, name and ``stat`` fields after the name."""
    for entry in Path("/proc").glob("[0-9]*"):
        stat = _stat(entry.name)
        if stat is not None and len(stat[1]) > 1:
            yield int(entry.name), *stat


def _pidfds(processes: dict[int, str]) -> dict[int, tuple[int, str]]:
    """A pidfd for each process still there (Linux 5.3+; none where the kernel lacks it):
    fd -> (pid, name)."""
    fds = {}
    for pid, name in processes.items():
        with contextlib.suppress(OSError, AttributeError):
            fds[os.pidfd_open(pid)] = (pid, name)
    return fds


def _signal_of_zombie(pid: int) -> str | None:
    """The signal that ended ``pid``, while it is a zombie (ended, not reaped): its
    ``/proc/PID/stat`` exit code, in ``waitpid``'s form (Linux 3.5+)."""
    stat = _stat(pid)
    if stat is None or stat[1][:1] != ["Z"] or len(stat[1]) < 50:
        return None
    status = int(stat[1][49])  # field 52 of stat, counting from the pid
    if not os.WIFSIGNALED(status):
        return None
    try:
        return signal.Signals(os.WTERMSIG(status)).name
    except ValueError:
        return None


def _zombie_children(pid: int) -> dict[int, str]:
    """The children of ``pid`` that have ended and wait to be reaped: pid -> name."""
    return {
        child: name
        for child, name, fields in _processes()
        if fields[0] == "Z" and int(fields[1]) == pid
    }


def _own_end(proc: subprocess.Popen[str]) -> tuple[str, str | None]:
    """How vLLM's API server ended where nothing else named a cause, and its signal."""
    code = proc.returncode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"vLLM's API server (pid {proc.pid}) was killed by {name}", name
    return "vLLM exited on its own", None


def _live_descendants(pid: int) -> dict[int, str]:
    """``descendants`` that have not ended (a zombie waits only to be reaped)."""
    found = descendants(pid)
    for child in list(found):
        stat = _stat(child)
        if stat is None or stat[1][:1] == ["Z"]:
            del found[child]
    return found


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (from ``/proc``): its pid -> its name (``VLLM::Worker``)."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for child, name, fields in _processes():
        names[child] = name
        children.setdefault(int(fields[1]), []).append(child)
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = names[child]
            todo.append(child)
    return found
