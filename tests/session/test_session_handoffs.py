"""A supervisor's workers, once they returned, are learned not to come back: over the runs of
one claimed graph, a returned worker's claim goes when the supervisor next calls. Real
LangGraph graphs on the embedded backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langgraph.errors import GraphRecursionError

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.bindings.decorators import claimed_session
from agentclaims.demo.workflows import build_supervisor, script, task_for


@pytest.fixture
async def backend():
    b = EmbeddedBackend(num_blocks=2048, block_size=16, script=script)
    yield b
    await b.aclose()


def _ended_early(log: Path) -> list[tuple[str, str]]:
    """(node, reason) of each claim that ended before the run did."""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [
        (e["node"], e["reason"])
        for e in lines
        if e["event"] == "claim_ended" and e.get("reason") == "reuse_unlikely"
    ]


async def test_returned_workers_claims_go_once_the_graph_learned_they_do_not_come_back(
    backend: EmbeddedBackend, tmp_path: Path
) -> None:
    graph = claimed_session(
        build_supervisor(agentclaims.chat_model(backend)), backend=backend, log_dir=tmp_path
    )
    early: list[list[tuple[str, str]]] = []
    for run in range(4):
        await graph.ainvoke({"messages": [HumanMessage(task_for(run))]}, {"recursion_limit": 60})
        session = graph.last_session
        assert session is not None
        early.append(_ended_early(tmp_path / f"{session.workflow_id}.jsonl"))
        # every completed run: each worker handed over once and did not come back; the
        # supervisor handed over twice and came back both times
        handoffs = run + 1
        assert graph.aeg.comeback_probability("researcher:model") == pytest.approx(
            0.125 / (handoffs + 0.25)
        )
        assert graph.aeg.comeback_probability("supervisor") == pytest.approx(
            (2 * handoffs + 0.125) / (2 * handoffs + 0.25)
        )
    # the first runs keep a returned worker's claim (the supervisor may route back to it)
    assert early[0] == []
    # from the fourth run on (three runs learned), it goes when the supervisor calls next
    assert ("researcher:model", "reuse_unlikely") in early[3]
    assert all(node != "supervisor" for node, _ in early[3])


async def test_a_run_cut_short_teaches_nothing(backend: EmbeddedBackend) -> None:
    graph = claimed_session(build_supervisor(agentclaims.chat_model(backend)), backend=backend)
    with pytest.raises(GraphRecursionError):
        await graph.ainvoke({"messages": [HumanMessage(task_for(0))]}, {"recursion_limit": 3})
    assert graph.aeg.comeback_probability("supervisor") is None
