"""The gateway's promotions (``agentclaims.gateway.queueing``): which calls go ahead in the
engine's queue. Any interleaving of calls taking and giving back their place (hypothesis)
never has more than ``most`` promoted in flight, promotes only workflows' calls, promotes
one whenever fewer than ``most`` are in flight, and counts every call it passed over. The
reference engine has no queue to order: its calls take no promotion."""

from __future__ import annotations

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentclaims.engine import ReferenceKV
from agentclaims.errors import UsageError
from agentclaims.gateway import ScriptedModel, create_app
from agentclaims.gateway.queueing import PROMOTED, Promotions

steps = st.lists(st.tuples(st.booleans(), st.booleans()), max_size=60)


@given(st.integers(0, 5), steps)
def test_promotions_never_exceed_their_bound(most: int, plan: list[tuple[bool, bool]]) -> None:
    """Each step a call arrives (a workflow's or not) or, the second flag set, the oldest
    call in flight is answered."""
    promotions = Promotions(most)
    flying: list[int | None] = []
    promoted = passed = 0
    for workflow, answer in plan:
        if answer and flying:
            promotions.give_back(flying.pop(0))
            continue
        held = sum(p is not None for p in flying)
        priority = promotions.take(workflow)
        if not workflow or most == 0:
            assert priority is None
        elif held < most:
            assert priority == PROMOTED
            promoted += 1
        else:
            assert priority is None
            passed += 1
        flying.append(priority)
        assert promotions.in_flight == sum(p is not None for p in flying) <= most
    assert promotions.stats() == {
        "most": most,
        "in_flight": sum(p is not None for p in flying),
        "promoted": promoted,
        "passed_over": passed,
    }


@pytest.mark.parametrize("most", [-1, 1.5, True, "4"])
def test_a_bad_bound_is_refused_before_anything_is_built(most: object) -> None:
    with pytest.raises(UsageError, match="promote"):
        Promotions(most)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="promote"):
        create_app(ReferenceKV.create(64, 16), ScriptedModel(), promote=most)  # type: ignore[arg-type]


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
    assert stats == {"most": 1, "in_flight": 0, "promoted": 0, "passed_over": 0}
