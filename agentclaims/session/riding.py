"""``RidingCalls``: what each LLM call of a session carries where claims ride on requests.

On a backend whose descriptor states ``claims_ride_on_requests`` (vLLM with the connector) a
call carries, in its ``agentclaims`` object, the claim on what it will leave cached
(``@sequence``), planned before it from what is known then (the graph, the tools the node's
last reply called, the learned waits), and the releases that waited for a call: the claim it
supersedes and those the session let go. Neither costs an engine request of its own. The
session revises the claim once the reply is in (``ClaimKeeper._after_riding``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentclaims.contract import prefix_blocks
from agentclaims.planner import POOL_KEEPS, SAVES_LESS, ClaimPlan, PrefixContext
from agentclaims.protocol import SEQUENCE_OBJECT
from agentclaims.session.claims import DONE_REASONS, ClaimIO, HeldClaim
from agentclaims.session.workflow import WorkflowModel, wait_key

if TYPE_CHECKING:
    from agentclaims.backends.base import Backend

__all__ = ["Riding", "RidingCalls"]


@dataclass(slots=True)
class Riding:
    """What one LLM call carries: the claim planned before it on what it leaves cached, and
    the releases that waited for it."""

    backend: str
    claim_id: str | None = None
    plan: ClaimPlan | None = None
    ctx: PrefixContext | None = None
    releases: list[HeldClaim] = field(default_factory=list)
    superseded: HeldClaim | None = None
    """The node's claim this call's own supersedes: the one that held its prefix."""
    declined: str | None = None
    """Why it carries no claim by choice: the engine's pool keeps its prefix through the wait
    (``POOL_KEEPS``), or the claim saves less time than it costs (``SAVES_LESS``). None is
    made on its own after it either, unless (``SAVES_LESS``) the answer calls other tools
    than ``tools``: a claim of its own is a request of its own, for what the call chose not
    to carry."""
    tools: tuple[str, ...] = ()
    """The tools the node was expected to call next when the call was planned."""
    when_done: bool = False
    """The call asked that its claim be released as it is answered, where the answer calls
    no tool (``release_when_done``: nothing uses the prefix after such a reply)."""

    def declined_for(self, tool_names: Sequence[str]) -> bool:
        """Whether the call's choice to carry no claim stands after an answer that called
        ``tool_names``: the pool keeps the prefix, or the claim was weighed with those tools
        expected and found to save less than it costs."""
        if self.declined == POOL_KEEPS:
            return True
        return self.declined == SAVES_LESS and set(tool_names) == set(self.tools)


class RidingCalls:
    """The calls in flight that carry claims or releases, and each node's last sequence."""

    def __init__(self, io: ClaimIO, workflow: WorkflowModel) -> None:
        self._io = io
        self._workflow = workflow
        self._calls: dict[str, Riding] = {}
        """request id -> what the call in flight carries."""
        self._sequences: dict[str, str] = {}
        """node -> the prefix id its last answered call left cached (its size: the next
        riding claim's expected footprint)."""

    async def plan(self, ext: dict[str, Any], node: str, backend: Backend) -> None:
        """Put into the call's extension object ``ext`` the claim on what it leaves cached and
        the releases waiting for it (``claims``, ``release``), and remember them."""
        io, workflow = self._io, self._workflow
        riding = Riding(backend.name)
        # still the session's (``io.releasing``) until the call's answer confirms them
        riding.releases = [h for h in io.releasing if h.backend == backend.name]
        tools = workflow.expected_tools(node)
        last = self._sequences.get(node)
        footprint, sized = (prefix_blocks(last), True) if last else (1, False)  # a first call
        ctx, plan = workflow.plan_after_call(
            node, SEQUENCE_OBJECT, tools, footprint=footprint, sized=sized
        )
        if plan.reason in (POOL_KEEPS, SAVES_LESS):
            riding.declined, riding.tools = plan.reason, tuple(tools)
        if plan.mode is not None:
            hint = workflow.reuse_hint(node, ctx, tool=wait_key(node, tools))
            found = await io.riding(backend, node, plan, ctx, hint)
            if found is not None:
                wire, riding.plan = found
                riding.claim_id, riding.ctx = wire["claim_id"], ctx
                ext["claims"] = [wire]
                if workflow.done_after_reply(
                    node, SEQUENCE_OBJECT, tools, footprint=footprint, sized=sized
                ):
                    ext["release_when_done"] = riding.when_done = True
                old = io.held.get(node)
                if old is not None and old.backend == backend.name:
                    # superseded by this call's claim: let go as it arrives (the call reuses
                    # those blocks as it runs; its own claim holds them once it finishes)
                    del io.held[node]
                    io.let_go(old, "superseded")
                    riding.releases.append(old)
                    riding.superseded = old
        if riding.releases:
            ext["release"] = [h.claim_id for h in riding.releases]
            done = [h.claim_id for h in riding.releases if h.end_reason in DONE_REASONS]
            if done:  # nothing will use their prefixes again: the next victims, not the freshest
                ext["release_done"] = done
        self._calls[ext["request_id"]] = riding

    def covering(self, request_id: str | None) -> HeldClaim | None:
        """The claim that held the prefix of the call ``request_id`` until it went (its own
        claim superseded it as it went)."""
        riding = self._calls.get(request_id or "")
        return None if riding is None else riding.superseded

    def failed(self, request_id: str) -> None:
        """The call got no answer: what it carried is forgotten (a claim it carried was never
        made; its releases stay with the session, for its next call)."""
        self._calls.pop(request_id, None)

    def still_goes_to(self, request_id: str | None, backend: Backend) -> bool:
        """Whether the call goes where it was planned for. After a failover or a reroute it
        does not: its claim is made, and booked, on ``backend`` now, and it carries no
        releases (that instance's claims are lost or were released with the move)."""
        riding = self._calls.get(request_id or "")
        if riding is None or riding.backend == backend.name:
            return True
        riding.backend = backend.name
        riding.releases = []  # still in ``io.releasing``: failed over or released from there
        return False

    def answered(self, call_id: str | None, node: str, sequence: str | None) -> Riding | None:
        """The call was answered (``sequence``: the prefix it left cached): what it carried,
        if anything."""
        if sequence:
            self._sequences[node] = sequence
        return self._calls.pop(call_id or "", None)
