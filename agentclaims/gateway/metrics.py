"""``/metrics`` in the Prometheus text format (prometheus-client), read at scrape time.

The gateway's own counters (calls per route, errors per type) and request latency histogram,
and whatever its KV side reports: the engine's counters (requests served, deferred, refused;
blocks hit, computed, evicted; claims accepted and rejected; true harm), the pool's occupancy,
the prefix hit ratio of served prompts, and live claims by mode and state. The same figures as
JSON are at ``GET /v1/stats``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from agentclaims.gateway.queueing import DECISIONS

__all__ = ["CONTENT_TYPE", "GatewayMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_PENDING = 256
"""Request times kept before they go into the latency histogram together (or at a read)."""


def _counts(
    name: str, documentation: str, label: str, counts: Mapping[str, float] | None
) -> CounterMetricFamily:
    """A counter family with one sample per key of ``counts`` (none where it is absent)."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for key, n in (counts or {}).items():
        family.add_metric([key], n)
    return family


class _Snapshot(Collector):
    """Families built from a ``stats()`` snapshot at each scrape."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        snap = self.stats()
        gw = snap.get("gateway", {})
        yield _counts("agentclaims_gateway_calls", "Requests per route", "route", gw.get("calls"))
        yield _counts(
            "agentclaims_gateway_errors", "Error answers per type", "type", gw.get("errors")
        )
        promotions = gw.get("promotions") or {}
        yield _counts(
            "agentclaims_gateway_promotions",
            "Workflow calls ahead in the engine's queue (promoted), or in arrival order and why",
            "decision",
            {k: promotions[k] for k in DECISIONS if k in promotions},
        )
        for name, value in (snap.get("engine") or {}).items():
            yield CounterMetricFamily(
                f"agentclaims_engine_{name}", f"Engine counter {name}", value=value
            )
        engine_requests = snap.get("engine_requests")
        if engine_requests:  # an upstream engine (vLLM): its requests, the agents' and ours
            yield _counts(
                "agentclaims_engine_requests",
                "Requests sent to the engine: agents' completions, the gateway's claim operations",
                "kind",
                engine_requests,
            )
            yield CounterMetricFamily(
                "agentclaims_bare_completions",
                "Plain OpenAI calls with nothing riding, forwarded to the engine unsigned",
                value=snap.get("bare_completions", 0),
            )
        verdicts = snap.get("request_verdicts")
        if verdicts is not None:  # vLLM's connector: requests held claims kept waiting
            yield _counts(
                "agentclaims_request_verdicts",
                "Requests the engine's admission deferred or refused for held claims' blocks, "
                "every request's (this gateway's and those sent to the engine by others)",
                "verdict",
                verdicts,
            )
        operations = snap.get("claim_operations")
        if operations:  # how the gateway's claim operations reached the engine
            yield _counts(
                "agentclaims_claim_operations",
                "Claim operations (releases) by how they reached the engine: rode on a request "
                "going anyway, or standalone after the ride bound; and channel round trips",
                "how",
                operations,
            )
            waited = snap.get("claim_operation_wait_s") or {}
            yield SummaryMetricFamily(
                "agentclaims_claim_operation_wait_seconds",
                "How long pending claim operations waited for a request to ride on",
                count_value=waited.get("count", 0),
                sum_value=waited.get("sum", 0.0),
            )
        pool = GaugeMetricFamily(
            "agentclaims_pool_blocks", "KV pool blocks by kind", labels=["kind"]
        )
        for kind, value in (snap.get("pool") or {}).items():
            pool.add_metric([kind], value)
        yield pool
        requests = snap.get("requests") or {}
        prompt, cached = requests.get("prompt_tokens", 0), requests.get("cached_tokens", 0)
        yield GaugeMetricFamily(
            "agentclaims_prefix_hit_ratio",
            "Share of served prompt tokens found in the prefix cache",
            value=cached / prompt if prompt else 0.0,
        )
        actions = CounterMetricFamily(
            "agentclaims_active_requests", "Active requests by arbiter action", labels=["action"]
        )
        for action, n in (requests.get("by_action") or {}).items():
            actions.add_metric([action], n)
        yield actions
        claims = GaugeMetricFamily(
            "agentclaims_claims", "Claims by protection mode and state", labels=["mode", "state"]
        )
        for key, n in (snap.get("claims") or {}).items():
            mode, _, state = key.partition("/")
            claims.add_metric([mode, state], n)
        yield claims
        yield from _service_families(snap)


_TENANT_COUNTS = {
    "requests": "Completions served or refused, per tenant",
    "refused": "Active requests refused, per tenant",
    "deferred": "Active requests deferred, per tenant",
    "claims_refused": "Claims refused over the tenant's limits, per tenant",
}


def _service_families(snap: Mapping[str, Any]) -> Iterator[Metric]:
    """Per tenant (with ``--api-keys``), harm by cause and the ledger (with a ledger)."""
    tenants = snap.get("tenants")
    if tenants is not None:
        for what, doc in _TENANT_COUNTS.items():
            family = CounterMetricFamily(f"agentclaims_tenant_{what}", doc, labels=["tenant"])
            for name, figures in tenants.items():
                family.add_metric([name], figures.get(what, 0))
            yield family
        for what, doc in (
            ("live_claims", "Live claims, per tenant"),
            ("protected_blocks", "Blocks covered by live protected claims, per tenant"),
        ):
            gauge = GaugeMetricFamily(f"agentclaims_tenant_{what}", doc, labels=["tenant"])
            for name, figures in tenants.items():
                gauge.add_metric([name], figures.get(what, 0))
            yield gauge
    harm = snap.get("harm")
    if harm is not None:
        family = CounterMetricFamily(
            "agentclaims_claims_harmed",
            "Claims harmed, by tenant and cause",
            labels=["tenant", "cause"],
        )
        for row in harm:
            family.add_metric([row["tenant"], row["cause"]], row["claims"])
        yield family
    ends = snap.get("ends")
    if ends is not None:
        for how, why, doc in (
            ("demoted", "reason", "Claims demoted, by tenant and reason"),
            (
                "expired",
                "reason",
                "Claims expired (TTL, release, revocation), by tenant and reason",
            ),
        ):
            family = CounterMetricFamily(f"agentclaims_claims_{how}", doc, labels=["tenant", why])
            for row in ends:
                if row["end"] == how:
                    family.add_metric([row["tenant"], row["why"]], row["claims"])
            yield family
    ledger = snap.get("ledger")
    if ledger is not None:
        yield CounterMetricFamily(
            "agentclaims_ledger_writes", "Ledger transactions committed", value=ledger["writes"]
        )
        yield CounterMetricFamily(
            "agentclaims_ledger_write_seconds", "Time spent committing", value=ledger["write_s"]
        )
        yield GaugeMetricFamily(
            "agentclaims_ledger_last_seq", "The event stream's last seq", value=ledger["last_seq"]
        )


class GatewayMetrics:
    """The gateway's registry: a latency histogram it observes and the snapshot collector."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "agentclaims_request_seconds",
            "Time to answer, per route",
            ["route"],
            registry=self.registry,
            buckets=_BUCKETS,
        )
        self.registry.register(_Snapshot(stats))
        self._routes: dict[str, Any] = {}
        self._pending: list[tuple[str, float]] = []

    def observe(self, route: str, seconds: float) -> None:
        """One request's time, put into the histogram with the next ``_PENDING`` others or
        at the next read, whichever comes first: a histogram read then counts every request
        answered before it, and a request does not pay the histogram's lock and bucket
        search of its own (every agent's call observes)."""
        pending = self._pending
        pending.append((route, seconds))
        if len(pending) >= _PENDING:
            self.flush()

    def flush(self) -> None:
        """Every pending observation into the histogram."""
        pending, self._pending = self._pending, []
        routes = self._routes
        for route, seconds in pending:
            child = routes.get(route)
            if child is None:  # one child per route, looked up once
                child = routes[route] = self.latency.labels(route)
            child.observe(seconds)

    def render(self) -> bytes:
        self.flush()
        return generate_latest(self.registry)
