"""The gateway's latency histogram counts every request answered before a read, though a
request's time goes into it with others (``GatewayMetrics.observe``), never on its own."""

from __future__ import annotations

import bisect

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agentclaims.gateway.metrics import _BUCKETS, GatewayMetrics

ROUTES = ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/events")


def histogram(text: bytes) -> dict[tuple[str, str, str], float]:
    """``agentclaims_request_seconds`` as read: (sample name, route, le) -> value."""
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    return {
        (s.name, s.labels["route"], s.labels.get("le", "")): s.value
        for s in families["agentclaims_request_seconds"].samples
        if not s.name.endswith("_created")
    }


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.sampled_from(ROUTES), st.floats(0, 20, allow_nan=False)), max_size=300
        ),
        min_size=1,
        max_size=4,
    )
)
def test_a_read_counts_every_request_answered_before_it(batches: list) -> None:
    """Reads between runs of requests of any length (over and under the batch the histogram
    takes them in): each read's counts, sums and buckets are those of every request so far."""
    metrics = GatewayMetrics(dict)
    seen: list[tuple[str, float]] = []
    for batch in batches:
        for route, seconds in batch:
            metrics.observe(route, seconds)
        seen += batch
        read = histogram(metrics.render())
        for route in ROUTES:
            times = [s for r, s in seen if r == route]
            if not times:
                assert ("agentclaims_request_seconds_count", route, "") not in read
                continue
            assert read["agentclaims_request_seconds_count", route, ""] == len(times)
            assert abs(read["agentclaims_request_seconds_sum", route, ""] - sum(times)) < 1e-6
            ordered = sorted(times)
            for le in _BUCKETS:
                below = bisect.bisect_right(ordered, le)
                key = ("agentclaims_request_seconds_bucket", route, str(le))
                assert read[key] == below, (route, le)
