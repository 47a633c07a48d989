"""A vLLM general plugin that lets vLLM's processes use AMX, on CPUs that have it.

vLLM's CPU attention picks its AMX kernel for bf16 with a block size of 32. On Linux a
process may execute AMX tile instructions only after it asked the kernel for the larger
register state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); a process that did
not ask is killed by SIGILL at its first tile instruction. oneDNN asks for itself, vLLM's own
kernels do not: on an AMX CPU a stock vLLM worker dies at the first attention step.

vLLM calls every ``vllm.general_plugins`` entry point in each of its processes (the API
server, the engine core and every worker) before any model runs, so this is where the request
belongs. The permission is per process and cleared by ``exec``, hence once in each.

Registered in this distribution's ``pyproject.toml``::

    [project.entry-points."vllm.general_plugins"]
    agentclaims_amx = "agentclaims_vllm.amx:register"

On a CPU without AMX, or off x86-64 Linux, it does nothing. It patches nothing in vLLM and
changes no setting: ``--dtype`` stays the user's. It says what it did in one line on stderr,
once per server (from the first of its processes; the others log it at debug level).
"""

from __future__ import annotations

import ctypes
import enum
import errno
import logging
import os
import platform
import sys
from dataclasses import dataclass

__all__ = [
    "AmxPermission",
    "AmxReport",
    "cpu_flags",
    "cpu_has_amx",
    "register",
    "request_amx_permission",
]

log = logging.getLogger("agentclaims_vllm.amx")

SYS_ARCH_PRCTL = 158
"""``arch_prctl``'s syscall number on x86-64."""
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
_LOGGED = "AGENTCLAIMS_AMX_LOGGED"
"""Set in the environment by the first process that logged: its children log at debug."""


class AmxPermission(enum.Enum):
    """What ``request_amx_permission`` found or did."""

    NOT_APPLICABLE = "not_applicable"
    """Not x86-64 Linux: AMX does not exist here."""
    NO_AMX = "no_amx"
    """The CPU does not list ``amx_tile``: vLLM never picks its AMX kernel; nothing to do."""
    GRANTED = "granted"
    """The kernel granted this process AMX tile data (or had already)."""
    REFUSED = "refused"
    """The CPU has AMX but the kernel refused the request (too old, or AMX disabled)."""


@dataclass(frozen=True, slots=True)
class AmxReport:
    permission: AmxPermission
    detail: str

    def __str__(self) -> str:
        return f"agentclaims AMX: {self.permission.value}: {self.detail} (pid {os.getpid()})"


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's flags, from the first ``flags`` line of ``cpuinfo`` (the text of
    ``/proc/cpuinfo``, read when not given); none where it cannot be read or has no such
    line."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether the CPU lists ``amx_tile`` among its flags (``cpu_flags``)."""
    return "amx_tile" in cpu_flags(cpuinfo)


def _arch_prctl(code: int, arg: int) -> int:
    """The raw syscall: 0, or ``-errno``."""
    libc = ctypes.CDLL(None, use_errno=True)
    result = int(libc.syscall(SYS_ARCH_PRCTL, code, ctypes.c_ulong(arg)))
    return -ctypes.get_errno() if result != 0 else 0


def _permitted() -> bool:
    """Whether this process may already use AMX tile data (``ARCH_GET_XCOMP_PERM``)."""
    mask = ctypes.c_ulong(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
        return False
    return bool(mask.value & (1 << XFEATURE_XTILEDATA))


def request_amx_permission(*, cpuinfo: str | None = None, machine: str | None = None) -> AmxReport:
    """Ask the kernel, once for this process, to let it use AMX tile data where the CPU has
    AMX (``cpuinfo``, ``machine``: what ``/proc/cpuinfo`` and ``platform.machine()`` say, read
    when not given)."""
    machine = platform.machine() if machine is None else machine
    if platform.system() != "Linux" or machine.lower() not in ("x86_64", "amd64"):
        return AmxReport(AmxPermission.NOT_APPLICABLE, f"not x86-64 Linux ({machine})")
    if not cpu_has_amx(cpuinfo):
        return AmxReport(AmxPermission.NO_AMX, "the CPU has no AMX; nothing to do")
    if _permitted():
        return AmxReport(AmxPermission.GRANTED, "AMX tile data already permitted")
    code = _arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    if code == 0 and _permitted():
        return AmxReport(
            AmxPermission.GRANTED,
            "asked the kernel for AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM): granted",
        )
    reason = errno.errorcode.get(-code, str(-code)) if code else "not granted"
    return AmxReport(
        AmxPermission.REFUSED,
        f"the CPU has AMX but the kernel refused AMX tile data ({reason}): vLLM's AMX "
        "attention kernel would die with SIGILL; serve with --dtype float16 or float32",
    )


def register() -> None:
    """vLLM's entry point (``vllm.general_plugins``): called in every vLLM process."""
    report = request_amx_permission()
    level = logging.WARNING if report.permission is AmxPermission.REFUSED else logging.INFO
    if os.environ.get(_LOGGED) and level == logging.INFO:
        level = logging.DEBUG
    os.environ[_LOGGED] = "1"
    _say(level, str(report))


def _say(level: int, message: str) -> None:
    """One line on stderr, beside vLLM's own (vLLM configures its log handlers in some of its
    processes only after it loads plugins, so a logger's line would be dropped there)."""
    if level >= logging.INFO:
        print(f"{logging.getLevelName(level)} {message}", file=sys.stderr, flush=True)
    else:
        log.log(level, message)
