"""The connector's freshness rule for signed envelopes (``agentclaims_vllm.signing``): an
envelope is accepted at most once, never when issued before the window began (a connector
started again), never when its issue time is far from now, and never after its nonce was
forgotten, whatever the order, the clock and the window's size."""

from __future__ import annotations

import pytest
from agentclaims_vllm.signing import NonceWindow, sign, verify
from hypothesis import given, settings
from hypothesis import strategies as st

S = 1_000_000_000  # ns in a second


class Clock:
    def __init__(self, at: int) -> None:
        self.at = at

    def __call__(self) -> int:
        return self.at


def test_an_envelope_is_accepted_once_while_fresh() -> None:
    clock = Clock(100 * S)
    window = NonceWindow(max_age_s=60, now=clock)
    clock.at += S
    assert window.check("n1", clock.at - S // 2) is None
    assert window.check("n1", clock.at - S // 2) == "replayed nonce"
    assert window.check("n2", 100 * S - 1).startswith("stale")  # before the window began
    assert window.check("n3", clock.at + 61 * S).startswith("stale")  # from the future
    clock.at += 120 * S
    assert window.check("n1", 101 * S - S // 2).startswith("stale")  # forgotten, still refused
    assert window.check("n4", None) == "no issue time (issued_ns)"
    assert window.check("n5", True) == "no issue time (issued_ns)"
    assert window.check("", clock.at) == "no nonce"


def test_a_window_that_forgets_early_refuses_what_it_forgot() -> None:
    clock = Clock(0)
    window = NonceWindow(size=2, max_age_s=60, now=clock)
    for i, nonce in enumerate(("a", "b", "c"), start=1):
        clock.at = i * S
        assert window.check(nonce, i * S) is None
    assert window.floor_ns == 1 * S  # "a" was forgotten before it went stale
    assert window.check("a", 1 * S) is not None
    assert window.check("b", 2 * S) == "replayed nonce"


def test_a_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="size"):
        NonceWindow(size=0)
    with pytest.raises(ValueError, match="max_age_s"):
        NonceWindow(max_age_s=0)


def test_the_signature_covers_the_issue_time_and_the_instance() -> None:
    envelope = sign({"v": 1, "nonce": "n", "issued_ns": 5, "instance": "i1", "ops": []}, "k")
    assert verify(envelope, "k")
    assert not verify({**envelope, "issued_ns": 6}, "k")
    assert not verify({**envelope, "instance": "i2"}, "k")


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 6),
    steps=st.lists(
        st.tuples(
            st.integers(0, 9),  # which envelope (its nonce and its issue time)
            st.integers(0, 40),  # seconds the clock moves first
        ),
        max_size=60,
    ),
)
def test_no_envelope_is_ever_accepted_twice_or_stale(
    size: int, steps: list[tuple[int, int]]
) -> None:
    start = 1000 * S
    clock = Clock(start)
    window = NonceWindow(size=size, max_age_s=30, now=clock)
    issued = {k: start + (k + 1) * 7 * S for k in range(10)}  # envelope k's signed issue time
    accepted: set[int] = set()
    for k, wait in steps:
        clock.at += wait * S
        reason = window.check(f"n{k}", issued[k])
        if reason is None:
            assert k not in accepted  # never twice
            assert abs(clock.at - issued[k]) <= 30 * S  # never stale
            assert issued[k] > start
            accepted.add(k)
