"""``SessionCalls``: the session's side of each LLM call, before it is sent and once answered.

Before: which node makes it (``node()``, else LangGraph's metadata), the request's
``agentclaims`` extension object, and where claims ride on requests what the call carries.
After: the call counted and logged (tokens, cache hits, deferrals, the route's hop), and the
claim work it calls for (``ClaimKeeper.after_call``) started in the background, overlapping
what the workflow does next; the next call or tool waits for it (``settle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentclaims.errors import BackendUnavailable, UsageError
from agentclaims.session.poolshare import PoolShare

if TYPE_CHECKING:
    from agentclaims.session.state import SessionState

__all__ = ["AnsweredCall", "SessionCalls"]

_current_node: ContextVar[str | None] = ContextVar("agentclaims_node", default=None)


@dataclass(frozen=True, slots=True)
class AnsweredCall:
    """An answered LLM call, as ``ClaimedSession.after_call`` is told of it."""

    node: str
    extension: Mapping[str, Any]
    usage: Mapping[str, Any]
    latency_s: float
    tool_names: Sequence[str] = ()
    request_id: str | None = None
    retried: bool = False
    model: str | None = None
    call_id: str | None = None


class SessionCalls:
    """The LLM calls of ``session``: named, prepared, recorded, and their claim work."""

    def __init__(self, session: SessionState) -> None:
        self._s = session
        self._requests = itertools.count(1)
        self._background: asyncio.Future[None] | None = None

    @contextlib.contextmanager
    def node(self, name: str) -> Iterator[None]:
        """``name`` makes the LLM calls inside the block (``ClaimedSession.node``)."""
        if not isinstance(name, str) or not name:
            raise UsageError("node", f"must be a non-empty string, got {name!r}")
        token = _current_node.set(name)
        try:
            yield
        finally:
            _current_node.reset(token)

    @staticmethod
    def current_node(metadata: Mapping[str, Any] | None = None) -> str:
        """The node making a call (``ClaimedSession.current_node``)."""
        explicit = _current_node.get()
        if explicit is not None:
            return explicit
        if metadata and "langgraph_node" in metadata:
            name = str(metadata["langgraph_node"])
            ns = str(metadata.get("langgraph_checkpoint_ns") or "")
            parents = [part.split(":", 1)[0] for part in ns.split("|")[:-1] if part]
            return ":".join([*parents, name])
        return "agent"

    def before_call(self, node: str, step: int | None = None) -> dict[str, Any]:
        """The request's extension object (``ClaimedSession.before_call``)."""
        s = self._s
        s.last_agent = node
        request_id = f"{s.session_id}-r{next(self._requests)}"
        s.io.calling = node
        s.io.request_nodes[request_id] = node
        return {
            "session_id": s.session_id,
            "workflow_id": s.workflow_id,
            "owner_scope": s.owner_scope,
            "node": node,
            "step": s.workflow.before_call(node, step),
            "request_id": request_id,
        }

    async def prepare_call(self, node: str, step: int | None = None) -> dict[str, Any]:
        """``before_call`` and what the call carries (``ClaimedSession.prepare_call``)."""
        s = self._s
        backend = s.backend
        share = s.workflow.share = PoolShare.of(backend)
        s.workflow.owner = s.session_id
        since = s.workflow.wait_started(node)
        if since is not None:  # how long agents wait between calls: what blocks must outlive
            share.note_wait(s.clock() - since)
        ext = self.before_call(node, step)
        # planner off: the SDK leaves the calls as they are (no admission either)
        waited = await share.admit_call(s.session_id) if s.planner.policy.enabled else 0.0
        if waited > 0:  # the pool thrashes: the agent waited for its turn (a deferral)
            s.stats.deferrals += 1
            s.stats.deferral_s += waited
            if s.log is not None:
                s.log.reaction(
                    "defer",
                    request_id=ext["request_id"],
                    delay_s=round(waited, 6),
                    reason="admission: the pool thrashes",
                    window=share.window.window,
                )
        try:
            if not await s.io.facts.rides(backend):
                return ext
            await s.keeper.follow_backend()
        except BackendUnavailable:
            return ext  # the call itself meets the outage (and fails over)
        await s.riding.plan(ext, node, backend)
        if await s.io.facts.events_ride(backend):  # its answer brings the events: no poll
            ext["events_since"] = s.io.events.cursor(backend)
        return ext

    def answered(self, call: AnsweredCall) -> None:
        """Record ``call`` and start the claim work it calls for, in the background."""
        s = self._s
        extension = call.extension
        answered = getattr(s.backend, "answered_by", None)
        if callable(answered):  # a fleet: the instance the answer names (streamed ones too)
            answered(extension)
            s.moves.follow_instance()
        sequence = self._record(call)
        previous = self._background
        riding = s.riding.answered(call.call_id, call.node, sequence)
        keeper = s.keeper

        async def claim_work() -> None:
            if previous is not None:
                await previous
            await keeper.after_call(call.node, riding, extension, sequence, call.tool_names)

        # the claim round trips overlap with what the workflow does next (tools, other nodes);
        # the next LLM call waits for them (``settle``)
        self._background = asyncio.ensure_future(claim_work())

    def _record(self, call: AnsweredCall) -> str | None:
        """Count ``call`` and log it; the prefix id it left cached, if the answer says."""
        s, node, extension, usage = self._s, call.node, call.extension, call.usage
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        completion = usage.get("completion_tokens")
        st = s.stats
        st.llm_calls += 1
        st.prompt_tokens += prompt
        st.cached_tokens += cached
        held_back = float(extension.get("deferred_s") or 0.0)
        if held_back > 0:  # deferred inside the engine (a vLLM connector's admission hook)
            st.deferrals += 1
            st.deferral_s += held_back
        pressed = call.retried or held_back > 0
        s.workflow.note_call(retried=pressed, latency_s=call.latency_s)
        pool = extension.get("pool")  # the engine's churn, where it says (vLLM: KV events)
        s.workflow.note_pool(pool)
        share = s.workflow.share
        if share is not None:
            share.note_pool(pool)
            share.observe_call(prompt_tokens=prompt, cached_tokens=cached, latency_s=call.latency_s)
        # the block cost: the session's own model, else the one every session on this
        # engine teaches (learned by default; the prior until the first answers)
        costs = s.engine_costs or (None if share is None else share.costs)
        computed = (extension.get("outcome") or {}).get("computed_blocks")
        if costs is not None and isinstance(computed, int) and isinstance(completion, int):
            # what this call cost on the engine (not the time it was held back)
            costs.observe(max(0.0, call.latency_s - held_back), computed, completion)
            if costs.learned or costs is s.engine_costs:  # the shared one: once it knows
                s.workflow.reload_s_per_block = costs.reload_s_per_block
        prefix_ids = extension.get("prefix_ids") or {}
        sequence: str | None = prefix_ids.get("sequence") or prefix_ids.get("prompt")
        s.route.observe_call(
            prompt_tokens=prompt, cached_tokens=min(cached, prompt), pressed=pressed
        )
        ste = s.workflow.near_ste(node)
        step = s.workflow.after_call(node, call.tool_names)
        if s.log is not None:
            # the claim that held this call's prefix (superseded as it went, where it rode)
            covering = s.io.held.get(node) or s.riding.covering(call.call_id)
            model = call.model
            s.log.llm_call(
                claim_id=None if covering is None else covering.claim_id,
                node=node,
                request_id=call.request_id or "",
                backend=s.backend.name,
                prompt_tokens=prompt,
                cached_tokens=cached,
                recomputed_tokens=prompt - cached,
                latency_s=round(call.latency_s, 6),
                step=step,
                ste=ste,
                model=model if isinstance(model, str) and model else None,
                completion_tokens=completion if isinstance(completion, int) else None,
                **({"deferred_s": round(held_back, 6)} if held_back > 0 else {}),
                **({"pool": pool} if isinstance(pool, dict) else {}),  # planned with
                **s.route.hop_fields(),
            )
        return sequence

    async def settle(self) -> None:
        """Wait for claim work still in flight; re-raises its error (e.g. ``ClaimRefused``)."""
        task, self._background = self._background, None
        if task is not None:
            await task
