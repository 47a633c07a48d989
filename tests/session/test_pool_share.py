"""``PoolShare``: the sessions of one process share one engine's pool by what each hold saves
per block-second, pin only where there is room, and admit model calls through an AIMD window
only while the pool thrashes."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.backends.http import HTTPBackend
from agentclaims.contract import ClaimEvent, EventName
from agentclaims.errors import UsageError
from agentclaims.session.poolshare import OPEN_WINDOW, PoolShare


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def share(usable: int | None = 100, **kw: object) -> PoolShare:
    s = PoolShare(clock=Clock(), **kw)  # type: ignore[arg-type]
    if usable is not None:
        s.note_pool({"usable_blocks": usable, "free_blocks": usable})
    return s


def test_denser_holds_keep_the_room():
    """60 of 100 blocks may be held: two holds worth 1.0 per block-second take 50; a sparser
    one of 20 does not fit, a denser one does (and the sparser ones then no longer fit)."""
    s = share()
    assert s.budget_blocks == 60
    s.hold(("a", "n"), 25, 1.0, 5.0)
    s.hold(("b", "n"), 25, 1.0, 5.0)
    assert not s.fits(("c", "n"), 20, 0.5)
    assert s.fits(("c", "n"), 20, 2.0)
    s.hold(("c", "n"), 20, 2.0, 5.0)
    assert not s.fits(("d", "n"), 5, 1.0)  # 25 + 25 + 20 as dense or denser: no room
    assert s.fits(("a", "n"), 15, 1.0)  # its own earlier hold is not counted against it


def test_holds_lapse_and_leave_with_their_session():
    s = share()
    clock = s.clock
    s.hold(("a", "n"), 50, 1.0, 2.0)  # kept about twice the expected time held
    assert not s.fits(("b", "n"), 20, 0.5)
    clock.now = 10.0  # type: ignore[attr-defined]
    assert s.fits(("b", "n"), 20, 0.5)
    s.hold(("b", "n"), 20, 0.5, 60.0)
    s.leave("b")
    assert s.held_blocks == 0


def test_unknown_pool_size_fits_everything_and_says_nothing_of_room():
    s = share(usable=None)
    assert s.fits(("a", "n"), 10_000, 0.0)
    assert s.room(("a", "n"), 1) is None


def test_no_pin_has_room_while_the_agents_contexts_overfill_the_share():
    """Five agents of 15 blocks on a 100-block pool (60 for holds): 75 do not fit, so no pin
    has room, though no hold is made yet; once two of them end, pins fit again."""
    s = share()
    for i in range(5):
        s.note_footprint((f"s{i}", "agent"), 15)
    assert s.working_set_blocks == 75
    assert s.room(("s0", "agent"), 15) is False
    s.leave("s3")
    s.leave("s4")
    assert s.room(("s0", "agent"), 15) is True


def test_room_for_a_pin_needs_free_blocks_too():
    s = share()
    assert s.room(("a", "n"), 40) is True
    s.note_pool({"free_blocks": 30})
    assert s.room(("a", "n"), 40) is False
    s.hold(("b", "n"), 50, 1.0, 5.0)
    assert s.room(("a", "n"), 20) is False  # 50 + 20 > 60


def test_pool_figures_are_read_as_the_answers_give_them():
    s = share(usable=None)
    s.note_pool({"usable_blocks": 64, "free_blocks": 10, "evicted_per_s": 4.0, "survival_s": 2.5})
    assert (s.usable_blocks, s.free_blocks, s.evicted_per_s, s.survival_s) == (64, 10, 4.0, 2.5)
    s.note_pool({"evicted_per_s": 0, "survival_s": None})
    assert s.survival_s == float("inf")
    s.note_pool({"usable_blocks": "many", "evicted_per_s": -1})  # nonsense changes nothing
    assert s.usable_blocks == 64
    assert s.evicted_per_s == 0.0
    s.note_pool(None)
    assert s.usable_blocks == 64


def test_bad_hold_share_is_refused():
    with pytest.raises(UsageError) as info:
        PoolShare(hold_share=0.0)
    assert info.value.field == "hold_share"


def test_one_share_per_url_and_per_embedded_engine():
    PoolShare.forget_all()
    a, b = HTTPBackend("http://127.0.0.1:9/v1"), HTTPBackend("http://127.0.0.1:9")
    assert PoolShare.of(a) is PoolShare.of(b)
    e1, e2 = EmbeddedBackend(num_blocks=64), EmbeddedBackend(num_blocks=64)
    assert PoolShare.of(e1) is not PoolShare.of(e2)
    assert PoolShare.of(e1) is PoolShare.of(e1)


async def test_admission_opens_for_everyone_until_the_pool_thrashes():
    """While the pool keeps up, every session's call goes at once. A period whose hit ratio
    fell well below its average while blocks outlive no agent's wait halves the window from
    the sessions running; a session over it waits at its next call until one ends."""
    s = share(period_calls=4)
    for sid in ("s1", "s2", "s3", "s4"):
        assert await s.admit_call(sid) == 0.0
        s.note_footprint((sid, "agent"), 40)  # 160 blocks of contexts on a 100-block pool
    assert s.window.window == OPEN_WINDOW
    s.note_pool({"evicted_per_s": 50.0, "survival_s": 0.5})
    for _ in range(3):
        s.note_wait(2.0)
    for _ in range(4):  # a good period: the average
        s.observe_call(prompt_tokens=100, cached_tokens=80, latency_s=1.0)
    assert s.window.window == OPEN_WINDOW
    for _ in range(4):  # hits collapse, blocks survive 0.5 s against 2 s waits, and the
        s.observe_call(prompt_tokens=100, cached_tokens=10, latency_s=1.0)  # engine is busy
    assert s.thrash_periods == 1
    assert s.window.window == 2
    waiter = asyncio.ensure_future(s.admit_call("s3"))  # over the window: gives its slot back
    await asyncio.sleep(0)
    assert not waiter.done()
    s.leave("s1")
    s.leave("s2")
    await asyncio.wait_for(waiter, 1.0)


def test_thrashing_while_the_agents_mostly_wait_engages_nothing():
    """Hits collapse and blocks outlive no wait, but the calls are few at a time (the agents
    wait on their tools, not on the engine): holding agents back would only make the
    workflows later, so the window stays open."""
    s = share(period_calls=4)
    clock = s.clock
    s.note_pool({"evicted_per_s": 50.0, "survival_s": 0.5})
    s.note_wait(2.0)
    for cached in (80, 80, 80, 80, 10, 10, 10, 10):
        clock.now += 2.0  # type: ignore[attr-defined]
        s.observe_call(prompt_tokens=100, cached_tokens=cached, latency_s=0.1)
    assert s.window.window == OPEN_WINDOW
    assert s.thrash_periods == 0


def test_thrashing_by_someone_elses_load_engages_nothing():
    """The agents' contexts fit the pool: hits collapse and blocks outlive no wait because
    another tenant turns the pool over, and fewer agents at once would not change that."""
    s = share(period_calls=4)
    for sid in ("s1", "s2"):
        s.note_footprint((sid, "agent"), 20)  # 40 of 100 blocks
    s.note_pool({"evicted_per_s": 50.0, "survival_s": 0.5})
    s.note_wait(2.0)
    for cached in (80, 80, 80, 80, 10, 10, 10, 10):
        s.observe_call(prompt_tokens=100, cached_tokens=cached, latency_s=1.0)
    assert s.window.window == OPEN_WINDOW
    assert s.thrash_periods == 0


def test_a_hit_drop_without_fast_turnover_is_no_thrashing():
    """Hits fall, but blocks survive far longer than the agents wait: the window stays open
    (the agents' prompts changed, not the pool's room)."""
    s = share(period_calls=2)
    s.note_pool({"evicted_per_s": 1.0, "survival_s": 120.0})
    s.note_wait(2.0)
    for cached in (90, 90, 5, 5):
        s.observe_call(prompt_tokens=100, cached_tokens=cached)
    assert s.window.window == OPEN_WINDOW
    assert s.thrash_periods == 0


@given(
    holds=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 80), st.floats(0.0, 10.0)), max_size=30
    )
)
def test_holds_admitted_by_fits_never_overfill_the_budget_for_denser_ones(holds):
    """Whatever order holds arrive in, each admitted one (``fits`` then ``hold``) saw the
    holds at least as dense as it, with it, within the budget."""
    s = share()
    budget = s.budget_blocks
    assert budget is not None
    for session, blocks, density in holds:
        key = (f"s{session}", "n")
        if s.fits(key, blocks, density):
            s.hold(key, blocks, density, 5.0)
            denser = sum(h.blocks for k, h in s._holds.items() if h.density >= density and k != key)
            assert denser + blocks <= budget


def test_a_new_sessions_first_call_plans_with_the_pool_the_process_knows():
    """A session that has had no answer yet takes the pool's survival from the last answer
    any session on that engine had: a quiet pool (nothing evicted for 30 s) keeps its first
    call's prefix through a short learned wait, so it claims nothing."""
    from test_session_wait_model import _model

    s = share()
    s.note_pool({"evicted_per_s": 0.0, "window_s": 30.0, "usable_blocks": 100})
    assert s.pool_survival_s == 30.0
    s.note_pool({"evicted_per_s": 0.0, "window_s": 3.0})  # just started: vouches for nothing
    assert s.pool_survival_s is None
    s.note_pool({"evicted_per_s": 0.0, "window_s": 30.0})
    model = _model([0.0])
    model.share = s
    model.tool_times.observe("search", 1.0)
    ctx = model.context("agent", "pfx-0123456789abcdef-4", ["search"])
    assert model.pool_survival_s is None
    assert ctx.pool_survival_s == 30.0
    assert ctx.pool_keeps(4.0)


def test_the_engines_regretted_share_is_kept_until_an_answer_says_another():
    """An answer's ``evicted_reused_p`` is what every session's plan prices a displaced block
    at; an answer without it (or with a value outside [0, 1]) leaves the last one said."""
    s = share()
    assert s.displaced_reuse_p is None  # unknown: the policy's prior stands
    s.note_pool({"evicted_per_s": 3.0, "survival_s": 10.0, "evicted_reused_p": 0.65})
    assert s.displaced_reuse_p == 0.65
    s.note_pool({"evicted_per_s": 3.0, "survival_s": 10.0})
    assert s.displaced_reuse_p == 0.65
    for bad in (1.5, -0.2, True, "0.3"):
        s.note_pool({"evicted_reused_p": bad})
        assert s.displaced_reuse_p == 0.65


_KEYS = st.tuples(st.sampled_from(["s1", "s2", "s3"]), st.sampled_from(["a", "b"]))


@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("note"), _KEYS, st.integers(min_value=0, max_value=500)),
            st.tuples(st.just("leave"), st.sampled_from(["s1", "s2", "s3"]), st.just(0)),
        ),
        max_size=40,
    ),
    key=_KEYS,
    blocks=st.integers(min_value=0, max_value=500),
)
def test_the_working_set_is_its_agents_contexts_added_up_as_they_change(
    steps: list[tuple[str, object, int]], key: tuple[str, str], blocks: int
) -> None:
    """Kept as the agents' contexts change and sessions leave (not summed again per call),
    the working set is always every live agent's latest context added up; ``room`` judges a
    pin against it with the asking agent's own context replaced by the pin's size."""
    s = share(usable=1000)
    latest: dict[tuple[str, str], int] = {}
    for what, who, size in steps:
        if what == "note":
            assert isinstance(who, tuple)
            s.note_footprint(who, size)
            latest[who] = size
        else:
            s.leave(str(who))
            latest = {k: v for k, v in latest.items() if k[0] != who}
        assert s.working_set_blocks == sum(latest.values())
    others = sum(v for k, v in latest.items() if k != key)
    budget = int(1000 * s.hold_share)
    assert s.room(key, blocks) == (others + blocks <= budget and blocks <= budget)


def _event(name: str, seq: int, **data: object) -> ClaimEvent:
    return ClaimEvent(
        EventName(name), seq, 0, seq, "run", "lru", 100, None, f"c{seq}", None, dict(data)
    )


def test_the_share_of_soft_holds_the_engine_keeps():
    """Accepted soft holds (vLLM's ``mode``, the reference engine's ``protection_mode``) and
    demotions of them: nothing is said before ``HOLDS_SEEN`` holds; then the share not shed.
    Pins and best-effort hints do not count."""
    s = share()
    accepted = [_event("resident_claim_accepted", i, mode="demotable") for i in range(5)]
    s.note_holds(accepted)
    s.note_holds([_event("resident_claim_accepted", 50, mode="hard_protected")])
    s.note_holds([_event("resident_claim_accepted", 51, protection_mode="best_effort")])
    assert s.hold_kept_p is None
    s.note_holds([_event("resident_claim_accepted", 60, protection_mode="soft_priority")])
    assert s.hold_kept_p == pytest.approx(1.0)
    s.note_holds(
        [_event("resident_claim_demoted", 70 + i, reason="memory_pressure") for i in range(4)]
    )
    p = s.hold_kept_p
    assert p is not None
    assert 0.2 < p < 0.3
    s.note_holds(
        [_event("resident_claim_demoted", 80 + i, reason="memory_pressure") for i in range(4)]
    )
    assert s.hold_kept_p == 0.0


def test_a_pool_that_shed_every_hold_is_tried_again_later():
    """The counts fade with time too: some minutes after the last soft hold, a pool that shed
    all of them says nothing again (``None``), so soft holds are planned and tried anew."""
    s = share()
    clock = s.clock
    s.note_holds([_event("resident_claim_accepted", i, mode="demotable") for i in range(10)])
    s.note_holds([_event("resident_claim_demoted", 20 + i) for i in range(10)])
    assert s.hold_kept_p == 0.0
    clock.now += 30.0  # type: ignore[attr-defined]
    assert s.hold_kept_p == 0.0
    clock.now += 300.0  # type: ignore[attr-defined]
    assert s.hold_kept_p is None


@given(st.lists(st.sampled_from(["held", "shed", "pin"]), max_size=200))
def test_the_kept_share_is_a_share(steps: list[str]):
    """Whatever the engine does, ``hold_kept_p`` is None or within [0, 1]; with no demotion
    at all it is 1 once enough holds were seen."""
    s = share()
    for i, step in enumerate(steps):
        if step == "held":
            s.note_holds([_event("resident_claim_accepted", i, mode="demotable")])
        elif step == "shed":
            s.note_holds([_event("resident_claim_demoted", i, reason="memory_pressure")])
        else:
            s.note_holds([_event("resident_claim_accepted", i, mode="hard_protected")])
        p = s.hold_kept_p
        assert p is None or 0.0 <= p <= 1.0
    if "shed" not in steps and steps.count("held") >= 10:
        assert s.hold_kept_p == pytest.approx(1.0)


_KEYS = st.tuples(st.sampled_from(["s0", "s1", "s2", "s3"]), st.sampled_from(["a", "b"]))
_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("hold"),
            _KEYS,
            st.integers(1, 40),
            st.one_of(st.floats(0.0, 5.0), st.just(float("inf")), st.just(float("nan"))),
            st.floats(0.0, 8.0),
        ),
        st.tuples(st.just("drop"), _KEYS),
        st.tuples(st.just("leave"), st.sampled_from(["s0", "s1", "s2", "s3"])),
        st.tuples(st.just("wait"), st.floats(0.0, 12.0)),
        st.tuples(
            st.just("ask"),
            _KEYS,
            st.integers(1, 80),
            st.one_of(st.floats(0.0, 5.0), st.just(float("nan"))),
        ),
    ),
    max_size=60,
)


@given(ops=_OPS)
def test_fits_room_and_held_blocks_answer_as_a_scan_of_every_live_hold(ops):
    """The share keeps running totals and indexes (a heap of ends, holds by density) so a call
    costs what changed, not every hold of every session: whatever holds come, are replaced,
    dropped, left or run out of time, ``fits``, ``room`` and ``held_blocks`` answer as the
    scan of every live hold they replaced (a hold whose worth is not a number ranks below
    every other)."""
    s = share()
    clock = s.clock
    budget = s.budget_blocks
    model: dict[tuple[str, str], tuple[int, float, float]] = {}  # key -> blocks, rank, until

    def live() -> dict[tuple[str, str], tuple[int, float, float]]:
        return {k: h for k, h in model.items() if h[2] > clock.now}  # type: ignore[attr-defined]

    for op in ops:
        if op[0] == "hold":
            _, key, blocks, density, seconds = op
            s.hold(key, blocks, density, seconds)
            rank = float("-inf") if density != density else density
            model[key] = (blocks, rank, clock.now + max(1.0, 2.0 * seconds))  # type: ignore[attr-defined]
        elif op[0] == "drop":
            s.drop(op[1])
            model.pop(op[1], None)
        elif op[0] == "leave":
            s.leave(op[1])
            model = {k: h for k, h in model.items() if k[0] != op[1]}
        elif op[0] == "wait":
            clock.now += op[1]  # type: ignore[attr-defined]
        else:
            _, key, blocks, density = op
            others = {k: h for k, h in live().items() if k != key}
            denser = sum(b for b, rank, _ in others.values() if rank >= density)
            assert s.fits(key, blocks, density) is (denser + blocks <= budget)
            held = sum(b for b, _, _ in others.values())
            assert s.room(key, blocks) is (blocks <= budget and held + blocks <= budget)
        assert s.held_blocks == sum(b for b, _, _ in live().values())


def test_a_hold_replaced_many_times_leaves_no_stale_end_behind():
    """Each call replaces its node's hold: the ends of the replaced ones do not pile up (the
    heap is rebuilt from the live holds past a bound), and the last hold still ends on time."""
    s = share()
    clock = s.clock
    for i in range(500):
        clock.now = i * 0.01  # type: ignore[attr-defined]
        s.hold(("a", "n"), 10, 1.0, 5.0)
        s.hold(("b", "n"), 5, 2.0, 1.0)
    assert len(s._expiry) <= 4 * 2 + 64 + 1
    assert s.held_blocks == 15
    clock.now += 2.5  # type: ignore[attr-defined]  # b's hold (2 s) ran out, a's (10 s) not
    assert s.held_blocks == 10
    assert s.fits(("c", "n"), 50, 0.5)
    clock.now += 10.0  # type: ignore[attr-defined]
    assert s.held_blocks == 0
