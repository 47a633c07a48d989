"""The connector distribution's vLLM plugins without vLLM: the AMX permission
(``agentclaims_vllm.amx``, real ``arch_prctl`` syscalls on this host) and the exit watch's
reading of a real child's status (``agentclaims_vllm.watch``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agentclaims_vllm import amx, watch
from agentclaims_vllm.amx import AmxPermission, cpu_has_amx, request_amx_permission
from hypothesis import given
from hypothesis import strategies as st

WITH_AMX = "processor\t: 0\nflags\t\t: fpu sse avx512f amx_bf16 amx_tile amx_int8\n"
WITHOUT_AMX = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n"
HOST_AMX = cpu_has_amx()


def test_amx_is_read_from_the_cpu_flags() -> None:
    assert cpu_has_amx(WITH_AMX)
    assert not cpu_has_amx(WITHOUT_AMX)
    assert not cpu_has_amx("processor\t: 0\nmodel name\t: amx_tile in a name\n")
    assert not cpu_has_amx("")
    assert cpu_has_amx() == ("amx_tile" in Path("/proc/cpuinfo").read_text())


def test_nothing_is_done_off_x86_or_without_amx() -> None:
    assert request_amx_permission(machine="aarch64").permission is AmxPermission.NOT_APPLICABLE
    report = request_amx_permission(cpuinfo=WITHOUT_AMX, machine="x86_64")
    assert report.permission is AmxPermission.NO_AMX
    assert "nothing to do" in str(report)


def _in_child(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTCLAIMS_AMX_LOGGED"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.mark.skipif(sys.platform != "linux", reason="arch_prctl is Linux's")
def test_the_kernel_is_really_asked_and_its_answer_reported() -> None:
    """Where the flags say AMX, the real syscall is made: on an AMX CPU the kernel grants it
    (and the process then holds the permission); on a CPU without AMX the kernel refuses
    (EOPNOTSUPP), and the report says so and what to do."""
    done = _in_child(
        f"""
        from agentclaims_vllm import amx
        report = amx.request_amx_permission(cpuinfo={WITH_AMX!r})
        print(report.permission.value, amx._permitted())
        print(report)
        """
    )
    assert done.returncode == 0, done.stderr
    first, text = done.stdout.splitlines()
    if HOST_AMX:
        assert first == "granted True"
    else:
        assert first == "refused False"
        assert "EOPNOTSUPP" in text or "ENOTSUP" in text or "EINVAL" in text
        assert "--dtype float16" in text


def test_the_plugin_says_what_it_did_once_per_server() -> None:
    """The first process logs one line on stderr; its children (the environment marks it)
    and later calls log at debug level only."""
    done = _in_child(
        """
        import os, subprocess, sys
        from agentclaims_vllm import amx
        amx.register()
        amx.register()
        subprocess.run([sys.executable, "-c", "from agentclaims_vllm import amx; amx.register()"])
        """
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "agentclaims AMX:" in line]
    assert len(lines) == 1, done.stderr
    expected = "granted" if HOST_AMX else "no_amx"
    assert lines[0].startswith("INFO agentclaims AMX: " + expected)


def test_the_watch_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    monkeypatch.delenv(watch.ENV, raising=False)
    before = threading.active_count()
    watch.register()
    assert threading.active_count() == before


@pytest.mark.parametrize("sig", [signal.SIGILL, signal.SIGKILL])
def test_the_watch_reads_a_childs_signal_and_leaves_it_to_be_reaped(sig: signal.Signals) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(child.pid, sig)
    status = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert status is not None
    assert watch.describe(status) == f"signal {sig.name} ({int(sig)})"
    assert child.wait(timeout=10) == -sig  # still there for its parent to reap
    line = f"agentclaims: vLLM process VLLM::Worker (pid {child.pid}) ended by " + watch.describe(
        status
    )
    match = watch.LINE.search(line)
    assert match is not None
    assert match["signal"] == sig.name


def test_a_clean_exit_is_described_as_such() -> None:
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    status = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert status is not None
    assert watch.describe(status) == "exit status 3"
    assert child.wait(timeout=10) == 3


def test_the_supervisor_reads_the_watch_line_as_the_plugin_writes_it() -> None:
    from agentclaims.vllm.supervise import DeathCause

    cause = DeathCause()
    written = "agentclaims: vLLM process VLLM::Worker (pid 12) ended by signal SIGILL (4)"
    assert watch.LINE.search(written) is not None
    assert cause.read(f"(EngineCore pid=3) ERROR 12-01 [watch.py:79] {written}")
    assert cause.signal == "SIGILL"
    assert str(cause) == "vLLM's VLLM::Worker (pid 12) was killed by SIGILL"
    assert not DeathCause().read(
        "agentclaims: vLLM process VLLM::Worker (pid 12) ended by exit status 0"
    )  # a clean exit is no death


def test_amx_module_names_the_syscall_it_makes() -> None:
    assert (amx.SYS_ARCH_PRCTL, amx.ARCH_REQ_XCOMP_PERM, amx.XFEATURE_XTILEDATA) == (
        158,
        0x1023,
        18,
    )


def test_the_signal_is_named_when_the_watch_lost_the_race_to_vllms_reaping() -> None:
    """vLLM's own exit code, else Python's fault handler's words, name the signal."""
    from agentclaims.vllm.supervise import DeathCause

    by_code = DeathCause()
    assert by_code.read(
        "(EngineCore pid=5) ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died "
        "unexpectedly (exit code: -9), shutting down executor."
    )
    assert (by_code.signal, by_code.process) == ("SIGKILL", "VllmWorker-0")
    by_fault = DeathCause()
    assert by_fault.read("Fatal Python error: Illegal instruction")
    assert by_fault.signal == "SIGILL"
    assert str(by_fault) == (
        "vLLM's process was killed by SIGILL (vLLM: Fatal Python error: Illegal instruction)"
    )
    unknown = DeathCause()
    assert unknown.read("Worker proc VllmWorker-0 died unexpectedly (exit code: None), ...")
    assert unknown.signal is None
    assert str(unknown).startswith("vLLM's engine died (vLLM: Worker proc VllmWorker-0 died")
    assert not DeathCause().read("INFO 12-01 [api_server.py:1] Starting vLLM API server")


_ENGINE_CORE_TERMINATED = (
    "(APIServer pid=2) ERROR [watch.py:79] agentclaims: vLLM process VLLM::EngineCor "
    "(pid 3) ended by signal SIGTERM (15)"
)
_WORKER_DIED_NO_CODE = (
    "(EngineCore pid=3) ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died "
    "unexpectedly (exit code: None), shutting down executor."
)
_WORKER_KILLED = (
    "(EngineCore pid=3) ERROR [watch.py:79] agentclaims: vLLM process VLLM::Worker (pid 4) "
    "ended by signal SIGKILL (9)"
)


@given(order=st.permutations([_ENGINE_CORE_TERMINATED, _WORKER_DIED_NO_CODE, _WORKER_KILLED]))
def test_a_workers_death_is_named_not_the_teardown_that_followed_it(order: list[str]) -> None:
    """vLLM SIGTERMs its engine core after a worker died: in whatever order the lines of the
    three processes reach the supervisor, the worker's signal names the death."""
    from agentclaims.vllm.supervise import DeathCause

    cause = DeathCause()
    for line in order:
        cause.read(line)
    assert (cause.signal, cause.process) == ("SIGKILL", "VLLM::Worker (pid 4)")
    assert str(cause).startswith("vLLM's VLLM::Worker (pid 4) was killed by SIGKILL (vLLM: ")


def test_without_the_workers_signal_the_teardown_is_not_named_in_its_place() -> None:
    from agentclaims.vllm.supervise import DeathCause

    cause = DeathCause()
    cause.read(_ENGINE_CORE_TERMINATED)
    assert cause.signal == "SIGTERM"  # alone, the engine core's end is the death
    cause.read(_WORKER_DIED_NO_CODE)
    assert (cause.signal, cause.process) == (None, None)
    assert str(cause) == (
        "vLLM's engine died (vLLM: Worker proc VllmWorker-0 died unexpectedly (exit code: None))"
    )
    cause.orphan("VLLM::Worker", 4, "SIGILL")  # its zombie, seen before vLLM reaped it
    cause.orphan("VLLM::Worker", 4, "SIGILL")
    assert str(cause).startswith("vLLM's VLLM::Worker (pid 4) was killed by SIGILL")


def test_what_the_supervisors_own_stop_ends_names_no_death() -> None:
    from agentclaims.vllm.supervise import DeathCause

    cause = DeathCause()
    assert cause.read(_ENGINE_CORE_TERMINATED, stopping=True)
    assert (cause.signal, cause.process) == (None, None)
    cause.read("Fatal Python error: Segmentation fault")
    assert cause.signal == "SIGSEGV"  # Python's own words still count


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGILL], ids=["SIGKILL", "SIGILL"])
def test_a_pidfd_wakes_as_a_process_ends_and_its_signal_is_read_before_it_is_reaped(
    sig: signal.Signals,
) -> None:
    """The supervisor's own witness, for when the watch plugin's line is lost (its
    ``waitid`` woken after vLLM reaped the worker, or its process killed first): a pidfd on
    each of vLLM's processes turns readable the instant one ends, and the zombie's signal is
    read from ``/proc`` then, while its parent has not reaped it yet."""
    import select

    from agentclaims.vllm.supervise import _pidfds, _signal_of_zombie

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fds = _pidfds({child.pid: "VLLM::Worker"})
    try:
        if not fds:
            pytest.skip("this kernel has no pidfd_open")
        [fd] = fds
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(0) == []  # alive: nothing to read
        assert _signal_of_zombie(child.pid) is None
        os.kill(child.pid, sig)
        assert poller.poll(10_000), "the pidfd never turned readable"
        assert _signal_of_zombie(child.pid) == sig.name  # not reaped: Popen has not waited
    finally:
        for fd in fds:
            os.close(fd)
        child.kill()
        child.wait()
    assert _signal_of_zombie(child.pid) is None  # reaped: nothing left to read


@given(
    before=st.lists(st.integers(10, 99), max_size=20),
    script=st.lists(st.integers(10, 99), max_size=20),
    after=st.lists(st.integers(10, 99), max_size=5),
)
def test_the_script_is_what_lies_between_the_prompts_last_marks(
    before: list[int], script: list[int], after: list[int]
) -> None:
    """``script_of``: the tokens between the last open mark and the close after it (an older
    script earlier in the conversation is not followed again); no whole script, none."""
    from agentclaims_vllm.tiny_model import script_of

    old = [1, 50, 51, 2]
    assert script_of([*old, *before, 1, *script, 2, *after], 1, 2) == script
    assert script_of([*before, *after], 1, 2) is None
    assert script_of([*before, 1, *script], 1, 2) is None  # never closed


def _sleep_a_minute() -> None:
    import time

    time.sleep(60)


def test_the_reaping_itself_names_the_signal_when_the_watch_loses_the_race(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """vLLM reaps a dead worker through ``multiprocessing`` at once, before the watch's
    ``waitid`` may look: the wrapped reaping logs the status it reaped, in the line the
    supervisor reads, once per child."""
    import logging
    import multiprocessing

    from agentclaims.vllm.supervise import DeathCause

    watch.watch_reaping()
    watch.watch_reaping()  # idempotent: wrapped once
    child = multiprocessing.get_context("fork").Process(target=_sleep_a_minute)
    child.start()
    assert child.pid is not None
    watch._NAMES[child.pid] = "VLLM::Worker"
    with caplog.at_level(logging.INFO, logger="vllm.plugins.agentclaims_watch"):
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=10)
        assert child.exitcode == -signal.SIGKILL  # vLLM's view of it is unchanged
        watch._await_exit(child.pid)  # the waiting thread, too late: nothing more is said
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"agentclaims: vLLM process VLLM::Worker (pid {child.pid}) ended by signal SIGKILL (9)"
    ]
    cause = DeathCause()
    assert cause.read(lines[0])
    assert cause.signal == "SIGKILL"
