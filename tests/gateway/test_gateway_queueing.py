"""The gateway's promotions (``agentclaims.gateway.queueing``): which calls go ahead in the
engine's queue. Any interleaving of calls taking and giving back their place (hypothesis)
never has more than ``most`` promoted in flight, promotes only workflows' calls, and none
while more than ``crowd`` workflow calls are in flight, an unheld one only where the engine's
queue lately waited at least ``margin`` prefills, promotes one whenever that allows, and counts
every call it passed over. Over any stretch of time the promoted calls' prefills stay within
``share`` of it and one prefill. The reference engine has no queue to order: its calls
take no promotion."""

from __future__ import annotations

import itertools

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agentclaims.engine import ReferenceKV
from agentclaims.errors import UsageError
from agentclaims.gateway import ScriptedModel, create_app
from agentclaims.gateway.queueing import MARGIN, PROMOTED, SHARE, Promotions
from agentclaims.vllm.engine_queue import QueueFigures

steps = st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), max_size=60)
waits = st.none() | st.builds(QueueFigures, st.floats(0, 10), st.floats(0, 10))


class _Queue:
    """Queue times as an ``EngineQueue`` reports them, fixed."""

    def __init__(self, figures: QueueFigures | None) -> None:
        self.latest = figures
        self.figures = lambda: figures

    async def aclose(self) -> None:
        pass


@given(st.integers(0, 5), st.integers(1, 6), waits, steps)
def test_promotions_never_exceed_their_bounds(
    most: int, crowd: int, figures: QueueFigures | None, plan: list[tuple[bool, bool, bool]]
) -> None:
    """Each step a call arrives (a workflow's or not, its prefix held or not) or, the third
    flag set, the oldest call in flight is answered; the engine's queue times are
    ``figures`` (``None``: not known yet). A minute passes between steps: the share of the
    time promoted calls take never binds here (the next test is about it)."""
    now = [0.0]

    def clock() -> float:
        now[0] += 60.0
        return now[0]

    promotions = Promotions(most, crowd, _Queue(figures), clock=clock)
    worth = figures is None or figures.wait_s >= MARGIN * figures.prefill_s
    flying: list[tuple[bool, int | None]] = []
    promoted = passed = short = 0
    for workflow, prefix_held, answer in plan:
        if answer and flying:
            promotions.give_back(*flying.pop(0))
            continue
        held = sum(p is not None for _, p in flying)
        workflows = sum(w for w, _ in flying) + 1
        priority = promotions.take(workflow, prefix_held)
        if not workflow or most == 0:
            assert priority is None
        elif not prefix_held and not worth:
            assert priority is None
            short += 1
        elif held < most and workflows <= crowd:
            assert priority == PROMOTED
            promoted += 1
        else:
            assert priority is None
            passed += 1
        flying.append((workflow, priority))
        assert promotions.in_flight == sum(p is not None for _, p in flying) <= most
    assert promotions.stats() == {
        "most": most,
        "in_flight": sum(p is not None for _, p in flying),
        "crowd": crowd,
        "workflows_in_flight": sum(w for w, _ in flying) if most else 0,
        "promoted": promoted,
        "passed_over": passed,
        "short_wait": short,
        "over_share": 0,
        "margin": MARGIN,
        "share": SHARE,
        "queue_wait_s": None if figures is None else round(figures.wait_s, 4),
        "prefill_s": None if figures is None else round(figures.prefill_s, 4),
    }


@given(
    st.floats(0.01, 1),
    st.floats(0.001, 5),
    st.lists(st.tuples(st.floats(0, 3), st.booleans()), min_size=1, max_size=80),
)
def test_promoted_calls_take_at_most_their_share_of_the_time(
    share: float, prefill_s: float, arrivals: list[tuple[float, bool]]
) -> None:
    """Workflow calls arrive ``dt`` apart (each answered before the next, so no other bound
    binds), their prefixes held or not, on an engine whose prefills lately took
    ``prefill_s`` and whose queue is worth skipping. Over every stretch between two calls,
    the prefills charged to the promotions in it are at most ``share`` of its length and one
    prefill (the call that put the pacing in debt); a call passed over is counted as
    ``over_share``, and one goes ahead whenever the promotions before it are paid for."""
    now = [0.0]
    figures = QueueFigures(wait_s=100 * prefill_s, prefill_s=prefill_s)
    promotions = Promotions(1, 4, _Queue(figures), share=share, clock=lambda: now[0])
    promoted_at: list[float] = []
    times: list[float] = []
    for dt, held in arrivals:
        now[0] += dt
        times.append(now[0])
        priority = promotions.take(True, held)
        if priority is not None:
            promoted_at.append(now[0])
        promotions.give_back(True, priority)
    assert promotions.promoted == len(promoted_at)
    assert promotions.promoted + promotions.over_share == len(arrivals)
    for i, start in enumerate(times):
        for end in times[i:]:
            charged = prefill_s * sum(start <= t <= end for t in promoted_at)
            assert charged <= share * (end - start) + prefill_s + 1e-9
    # the first call goes ahead; so does each one a whole pacing interval after the last
    assert promoted_at[:1] == times[:1]
    for before, after in itertools.pairwise(times):
        last = max((t for t in promoted_at if t <= before), default=None)
        if last is not None and after - last >= prefill_s / share * (1 + 1e-9) + 1e-9:
            assert after in promoted_at


@pytest.mark.parametrize("most", [-1, 1.5, True, "4"])
def test_a_bad_bound_is_refused_before_anything_is_built(most: object) -> None:
    with pytest.raises(UsageError, match="promote"):
        Promotions(most)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="promote"):
        create_app(ReferenceKV.create(64, 16), ScriptedModel(), promote=most)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="crowd"):
        Promotions(1, crowd=0)
    with pytest.raises(UsageError, match="margin"):
        Promotions(1, margin=float("nan"))
    for share in (0, 1.5, float("nan"), True):
        with pytest.raises(UsageError, match="share"):
            Promotions(1, share=share)
        with pytest.raises(UsageError, match="share"):
            create_app(ReferenceKV.create(64, 16), ScriptedModel(), promote_share=share)


async def test_the_reference_engine_promotes_no_call() -> None:
    app = create_app(ReferenceKV.create(64, 16), ScriptedModel())
    body = {
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
        "agentclaims": {"owner_scope": "wf"},
    }
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://gw"
    ) as http:
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
        stats = (await http.get("/v1/stats")).json()["gateway"]["promotions"]
        scraped = (await http.get("/metrics")).text
    assert stats["promoted"] == stats["passed_over"] == stats["workflows_in_flight"] == 0
    assert stats["engine_orders_by_priority"] is False
    [family] = [f for f in text_string_to_metric_families(scraped) if f.name.endswith("promotions")]
    counted = {s.labels["decision"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert counted == dict.fromkeys(("promoted", "passed_over", "short_wait", "over_share"), 0)
