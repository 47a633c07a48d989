"""The AIMD admission window: bounds, FIFO, the controller, cancellation, and a pool of real
embedded backends admitting real sessions through it."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentclaims
from agentclaims.backends.admission import AdmissionWindow
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.backends.pool import BackendPool
from agentclaims.errors import UsageError
from agentclaims.session import ClaimedSession


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("min_window", {"min_window": 0}),
        ("max_window", {"min_window": 4, "max_window": 2, "initial": 3}),
        ("initial", {"initial": 0}),
        ("initial", {"initial": 9, "max_window": 8}),
        ("increase", {"increase": 0}),
        ("decrease", {"decrease": 1.0}),
        ("decrease", {"decrease": 0}),
        ("period_calls", {"period_calls": True}),
        ("max_pressed_share", {"max_pressed_share": 1.5}),
        ("max_hit_drop", {"max_hit_drop": float("nan")}),
        ("max_kv_usage", {"max_kv_usage": -0.1}),
    ],
)
def test_bad_parameters_raise_typed_errors_naming_the_field(field, kwargs):
    with pytest.raises(UsageError, match=field):
        AdmissionWindow(**kwargs)


def test_bad_observation_changes_nothing():
    w = AdmissionWindow(initial=2, period_calls=1)
    with pytest.raises(UsageError, match="cached_tokens"):
        w.observe(prompt_tokens=10, cached_tokens=11)
    with pytest.raises(UsageError, match="kv_usage"):
        w.observe(prompt_tokens=10, kv_usage=2.0)
    assert (w.window, w.stats.periods) == (2, 0)
    with pytest.raises(UsageError, match="key"):
        w.request("")
    assert w.request("a")
    with pytest.raises(UsageError, match="already"):
        w.request("a")


def test_pressure_halves_and_health_grows_only_a_used_window():
    w = AdmissionWindow(initial=8, min_window=2, max_window=10, period_calls=2)
    for key in "abcdefgh":
        assert w.request(key)
    w.observe(prompt_tokens=100, cached_tokens=90)
    w.observe(prompt_tokens=100, cached_tokens=90)  # healthy and full: +1
    assert w.window == 9
    w.observe(prompt_tokens=100, cached_tokens=90, pressed=True)
    w.observe(prompt_tokens=100, cached_tokens=90)  # half the calls deferred: halve
    assert w.window == 4
    for _ in range(3):  # a harmed claim each period: down to the floor
        w.observe(harmed=1)
        w.observe(prompt_tokens=100, cached_tokens=90)
        w.observe(prompt_tokens=100, cached_tokens=90)
    assert w.window == 2
    for key in "abcdefgh":
        w.release(key)
    w.observe(prompt_tokens=100, cached_tokens=90)
    w.observe(prompt_tokens=100, cached_tokens=90)  # full when this period began: +1
    assert w.window == 3
    for _ in range(6):  # healthy but unused since: stays
        w.observe(prompt_tokens=100, cached_tokens=90)
    assert w.window == 3
    assert w.stats.increases == 2
    assert w.stats.decreases == 2


def test_a_hit_ratio_collapse_is_pressure():
    w = AdmissionWindow(initial=4, period_calls=1, max_hit_drop=0.2)
    assert w.request("a")
    w.observe(prompt_tokens=100, cached_tokens=80)  # first period: the baseline
    w.observe(prompt_tokens=100, cached_tokens=30)  # far below it
    assert w.window == 2
    w.observe(prompt_tokens=100, cached_tokens=20, kv_usage=0.99)  # KV usage over the bound
    assert w.window == 1


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.integers(0, 30)),
        st.tuples(st.just("release"), st.integers(0, 30)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("call"), st.integers(0, 3)),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(_OPS, st.integers(1, 4), st.integers(4, 12), st.integers(1, 3))
def test_window_invariants_under_any_sequence(ops, low, high, period):
    """The window stays within [min, max]; nobody is admitted beyond it; nobody waits while a
    slot is free; those who waited are admitted in the order they came; every key is either
    active, waiting or gone (none lost, none twice)."""
    w = AdmissionWindow(initial=low, min_window=low, max_window=high, period_calls=period)
    requested: list[str] = []  # waiting keys in request order
    order: list[str] = []  # keys admitted after waiting, in admission order
    active: set[str] = set()
    for op, n in ops:
        key = f"s{n}"
        if op == "request":
            if key in active or key in requested:
                continue
            if w.request(key):
                active.add(key)
            else:
                requested.append(key)
            admitted: list[str] = []
        elif op == "release":
            admitted = w.release(key)
            active.discard(key)
        elif op == "cancel":
            if key in requested:
                requested.remove(key)
            active.discard(key)
            admitted = w.cancel(key)
        else:  # one answered call: pressed, harmed, or healthy
            admitted = w.observe(
                prompt_tokens=100, cached_tokens=50 + 10 * n, pressed=n == 0, harmed=int(n == 1)
            )
        for k in admitted:
            assert k == requested.pop(0)  # FIFO
            order.append(k)
            active.add(k)
        if admitted:
            assert w.active <= w.window
        assert low <= w.window <= high
        assert w.active == len(active)
        assert w.waiting == len(requested)
        assert all(w.is_active(k) for k in active)
        if w.waiting:
            assert w.active >= w.window  # work conserving


async def test_acquire_waits_fifo_and_loses_nobody_on_cancellation():
    """Ten sessions on a window of 2, some cancelled while waiting, one cancelled just after
    its slot was granted: every other session runs, in arrival order, never more than 2 at
    once, and the window ends empty."""
    w = AdmissionWindow(initial=2, min_window=1, max_window=2)
    started: list[str] = []
    running = 0
    peak = 0
    gates = {f"s{i}": asyncio.Event() for i in range(10)}

    async def session(key: str) -> None:
        nonlocal running, peak
        await w.acquire(key)
        try:
            started.append(key)
            running += 1
            peak = max(peak, running)
            await gates[key].wait()
        finally:
            running -= 1
            w.release(key)

    tasks = {key: asyncio.create_task(session(key)) for key in gates}
    await asyncio.sleep(0)
    assert started == ["s0", "s1"]
    assert w.waiting == 8
    for key in ("s3", "s6"):  # cancelled while waiting
        tasks[key].cancel()
    await asyncio.sleep(0)
    gates["s0"].set()
    await asyncio.sleep(0)
    tasks["s2"].cancel()  # s2 was just granted s0's slot: it must give it back
    for _ in range(5):
        await asyncio.sleep(0)
    for key in gates:
        gates[key].set()
        for _ in range(3):
            await asyncio.sleep(0)
    # bounded: a lost slot would leave the sessions behind it waiting forever
    results = await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 5)
    cancelled = {k for k, r in zip(tasks, results, strict=True) if isinstance(r, BaseException)}
    assert cancelled <= {"s2", "s3", "s6"}
    assert {"s3", "s6"} <= cancelled
    assert [k for k in started if k not in ("s0", "s1")] == [
        k for k in gates if k not in cancelled and k not in ("s0", "s1")
    ]
    assert peak <= 2
    assert (w.active, w.waiting) == (0, 0)


async def test_a_pool_with_a_window_of_one_runs_sessions_one_after_another():
    """Real sessions on a pool of two embedded engines, window 1: the second session enters
    only when the first has ended; both complete their calls."""
    members = [EmbeddedBackend(num_blocks=256, name="a"), EmbeddedBackend(num_blocks=256, name="b")]
    pool = BackendPool(members, admission=AdmissionWindow(initial=1, max_window=1))
    order: list[str] = []

    async def run(label: str) -> None:
        async with ClaimedSession(pool) as session:
            order.append(f"{label} in")
            client = agentclaims.openai_client(session.backend)
            await client.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "hello " * 40}]
            )
            await asyncio.sleep(0.01)
            order.append(f"{label} out")

    try:
        await asyncio.gather(run("first"), run("second"))
    finally:
        await pool.aclose()
    assert order == ["first in", "first out", "second in", "second out"]
    assert pool.admission is not None
    assert pool.admission.stats.deferred == 1
    assert pool.admission.active == 0


def test_pool_rejects_a_non_window():
    with pytest.raises(UsageError, match="admission"):
        BackendPool([EmbeddedBackend(num_blocks=8)], admission=4)  # type: ignore[arg-type]
