"""The gateway's promotions (``agentclaims.gateway.queueing``): which calls go ahead in the
engine's queue. Any interleaving of calls taking and giving back their place (hypothesis)
never has more than ``most`` promoted in flight, promotes only workflows' calls, and none
while more than ``crowd`` workflow calls are in flight, an unheld one only where the engine's
queue lately waited at least ``margin`` prefills, promotes one whenever that allows, and counts
every call it passed over. Over any stretch of time the promoted calls' prefills stay within
``share`` of it and one prefill. The reference engine has no queue to order: its calls
take no promotion."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agentclaims.engine import ReferenceKV
from agentclaims.errors import UsageError
from agentclaims.gateway import ScriptedModel, create_app
from agentclaims.gateway.completions import computed_tokens
from agentclaims.gateway.queueing import MARGIN, PROMOTED, SHARE, Promotions
from agentclaims.gateway.streaming import JSONResponse
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
    ``figures`` (``None``: not known yet). Hours pass between steps: the share of the time
    promoted calls take never binds here (the next test is about it)."""
    now = [0.0]

    def clock() -> float:
        now[0] += 3600.0
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
        "prefill_token_s": None if figures is None else figures.token_s,
    }


@given(
    st.floats(0.01, 1),
    st.floats(0.001, 5),
    st.none() | st.floats(1e-5, 1e-2),
    st.lists(
        st.tuples(st.floats(0, 3), st.booleans(), st.none() | st.integers(0, 2000)),
        min_size=1,
        max_size=80,
    ),
)
def test_promoted_calls_take_at_most_their_share_of_the_time(
    share: float,
    prefill_s: float,
    token_s: float | None,
    arrivals: list[tuple[float, bool, int | None]],
) -> None:
    """Workflow calls arrive ``dt`` apart (each answered before the next, so no other bound
    binds), their prefixes held or not, each answered with the tokens vLLM computed for it
    (``None``: not said, as for a stream), on an engine whose prefills lately took
    ``prefill_s`` (``token_s`` a computed token) and whose queue is worth skipping. A
    promoted call is charged ``token_s`` times its computed tokens, else ``prefill_s``. Over
    every stretch between two calls, the charges of the promotions in it are at most
    ``share`` of its length and the last one's; a call passed over is counted as
    ``over_share``, and one goes ahead whenever those before it are paid for."""
    now = [0.0]
    figures = QueueFigures(100 * prefill_s, prefill_s, token_s)
    promotions = Promotions(1, 4, _Queue(figures), share=share, clock=lambda: now[0])
    promoted: list[tuple[float, float]] = []  # (when, charged)
    times: list[float] = []
    for dt, held, computed in arrivals:
        now[0] += dt
        times.append(now[0])
        paid = not promoted or share * (now[0] - promoted[-1][0]) >= promoted[-1][1] + 1e-9
        priority = promotions.take(True, held)
        charge = prefill_s if computed is None or token_s is None else token_s * computed
        if priority is not None:
            promoted.append((now[0], charge))
        elif paid:
            raise AssertionError(f"passed over at {now[0]} though paid for: {promoted[-1:]}")
        promotions.give_back(True, priority, computed)
        assert promotions.cost(computed) == pytest.approx(charge)
    assert promotions.promoted == len(promoted)
    assert promotions.promoted + promotions.over_share == len(arrivals)
    assert promoted[0][0] == times[0]  # the first call goes ahead
    for i, start in enumerate(times):
        for end in times[i:]:
            inside = [c for t, c in promoted if start <= t <= end]
            assert sum(inside) <= share * (end - start) + max(inside, default=0) + 1e-9


def test_a_promoted_call_is_charged_the_tokens_its_answer_says_vllm_computed() -> None:
    """``computed_tokens`` reads an answer's ``usage`` (the prompt's tokens less the cached
    ones); a stream, an error or an answer without them is ``None`` (the mean prefill)."""
    from starlette.responses import StreamingResponse

    def answer(usage: object, status: int = 200) -> JSONResponse:
        return JSONResponse({"choices": [], "usage": usage}, status_code=status)

    details = {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 960}}
    assert computed_tokens(answer(details)) == 40
    assert computed_tokens(answer({"prompt_tokens": 300})) == 300
    assert computed_tokens(answer({"prompt_tokens": 30, "prompt_tokens_details": None})) == 30
    for usage in (None, {}, {"prompt_tokens": "12"}, {"prompt_tokens": True}):
        assert computed_tokens(answer(usage)) is None
    assert computed_tokens(answer(details, status=409)) is None
    assert computed_tokens(None) is None

    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: {}\n\n"

    assert computed_tokens(StreamingResponse(chunks())) is None


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
