"""The Grafana dashboard in docs/grafana/agentclaims-gateway.json against a real gateway: every
PromQL query in it (panels, collapsed rows' panels, template variables) is read for the series
it names and the labels it matches or groups by, and each must be served, with those labels,
by the `/metrics` of a real `agentclaims serve` process on loopback (keys, a ledger, a restart
on it, and real traffic: claims accepted, refused, demoted, released, harmed; a refusal),
scraped over HTTP and parsed with prometheus-client's text parser. The reader is checked on
its own too, so that a query naming nothing served is reported, not passed."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from servers import gateway_process

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "agentclaims-gateway.json"

ALPHA = "ak-alpha-0123456789abcdef"
OPS = "ak-ops-0123456789abcdef"
KEYS = f"""
[[key]]
key = "{ALPHA}"
tenant = "alpha"
max_claims = 2

[[key]]
key = "{OPS}"
tenant = "ops"
admin = true
"""

# ---------------------------------------------------------------- reading PromQL


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


AGGREGATIONS = _words(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk "
    "limit_ratio"
)
FUNCTIONS = _words(
    """abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes
    clamp clamp_max clamp_min cos cosh count_over_time days_in_month day_of_month day_of_week
    day_of_year deg delta deriv double_exponential_smoothing exp first_over_time floor
    histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev
    histogram_stdvar histogram_sum holt_winters hour idelta increase info irate label_join
    label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute
    month pi predict_linear present_over_time quantile_over_time rad rate resets round scalar
    sgn sin sinh sort sort_by_label sort_by_label_desc sort_desc sqrt stddev_over_time
    stdvar_over_time sum_over_time tan tanh time timestamp vector year"""
)
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = GROUPING | {"and", "or", "unless", "atan2", "bool", "offset", "inf", "nan"}
TARGET_LABELS = frozenset({"instance", "job"})
"""Labels Prometheus itself puts on every series it scrapes: no exporter serves them."""

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    |(?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
    |(?P<var>\$\{[^}]*\}|\$\w+|\[\[\w+\]\])
    |(?P<range>\[[^\[\]]*\])
    |(?P<number>0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:ms|[smhdwy])*)
    |(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    |(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^=<>,(){}@])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Selector:
    """One series a query selects: its metric name and its label matchers (label, op, value)."""

    series: str
    matchers: tuple[tuple[str, str, str], ...] = ()

    def labels(self) -> set[str]:
        return {label for label, _, _ in self.matchers}


@dataclass
class Query:
    """What one PromQL query names: series, the labels its ``by``/``without``/``on``/
    ``ignoring``/``group_*`` clauses name, and what it could not read."""

    where: str
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def series(self) -> set[str]:
        return {s.series for s in self.selectors}


def tokens(expr: str) -> list[tuple[str, str]]:
    """``expr`` as (kind, text) tokens, spaces dropped; a character PromQL has no use for is
    a ``ValueError``. Range and subquery brackets (``[$__rate_interval]``, ``[5m:1m]``) and
    Grafana variables stay whole."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read PromQL at {expr[pos : pos + 20]!r}")
        kind = m.lastgroup
        assert kind is not None
        if kind != "space":
            out.append((kind, m.group()))
        pos = m.end()
    return out


def _unquote(text: str) -> str:
    return text[1:-1]


def read_promql(expr: str, where: str) -> Query:
    """The series ``expr`` names (identifiers that are neither functions, aggregations,
    keywords, nor label names inside ``{...}`` or a grouping clause), each with its matchers."""
    query = Query(where)
    try:
        toks = tokens(expr)
    except ValueError as exc:
        query.errors.append(f"{where}: {exc}")
        return query
    i = 0

    def peek(k: int = 0) -> tuple[str, str]:
        return toks[i + k] if i + k < len(toks) else ("end", "")

    def matchers() -> tuple[tuple[str, str, str], ...]:
        """``{label op "value", ...}`` from the ``{`` at ``i``; ``i`` past the ``}``."""
        nonlocal i
        found: list[tuple[str, str, str]] = []
        i += 1
        while peek() != ("op", "}"):
            (k1, label), (k2, op), (k3, value) = peek(), peek(1), peek(2)
            if k1 not in ("ident", "string") or op not in ("=", "!=", "=~", "!~") or k2 != "op":
                raise ValueError(f"bad label matcher at {label!r} {op!r}")
            if k3 != "string":
                raise ValueError(f"label {label!r} is matched against {value!r}, not a string")
            found.append((label if k1 == "ident" else _unquote(label), op, _unquote(value)))
            i += 3
            if peek() == ("op", ","):
                i += 1
        i += 1
        return tuple(found)

    try:
        while i < len(toks):
            kind, text = toks[i]
            if kind == "ident" and text in GROUPING:
                i += 1
                if peek() == ("op", "("):
                    i += 1
                    while peek() != ("op", ")"):
                        k, name = peek()
                        if k == "ident":
                            query.grouping.add(name)
                        elif (k, name) != ("op", ","):
                            raise ValueError(f"{text} ({name!r}: not a label name")
                        i += 1
                    i += 1
            elif kind == "ident" and text == "offset":
                i += 2 if peek(1) != ("op", "-") else 3
            elif kind == "op" and text == "@":
                i += 4 if peek(1)[1] in ("start", "end") else 2
            elif kind == "ident" and (text in KEYWORDS or text in AGGREGATIONS):
                i += 1
            elif kind == "ident" and peek(1) == ("op", "("):
                if text not in FUNCTIONS:
                    query.errors.append(f"{where}: {text}() is no PromQL function")
                i += 1
            elif kind == "ident":
                i += 1
                found = matchers() if peek() == ("op", "{") else ()
                query.selectors.append(Selector(text, found))
            elif (kind, text) == ("op", "{"):  # {__name__="series", ...}
                found = matchers()
                names = [v for label, op, v in found if label == "__name__" and op == "="]
                if not names:
                    raise ValueError("a selector without a metric name")
                query.selectors.append(Selector(names[0], found))
            else:
                i += 1
    except ValueError as exc:
        query.errors.append(f"{where}: {exc}")
    return query


_LABEL_VALUES = re.compile(
    r"^\s*label_values\((?P<selector>.+),\s*(?P<label>[A-Za-z_]\w*)\s*\)\s*$"
)


def read_variable(query_text: str, where: str) -> Query:
    """A Grafana template variable's ``label_values(selector, label)``: the selector's
    series, and ``label`` as a label they must carry (in ``grouping``)."""
    m = _LABEL_VALUES.match(query_text)
    if m is None:
        query = Query(where)
        query.errors.append(
            f"{where}: {query_text!r} is not label_values(<series>, <label>): it names no family"
        )
        return query
    query = read_promql(m["selector"], where)
    query.grouping.add(m["label"])
    return query


# ---------------------------------------------------------------- the dashboard


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' own panels (a collapsed row keeps them inside) included."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every panel target's ``expr`` and every query variable's query, read."""
    out: list[Query] = []
    for panel in all_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            where = f"panel {panel['title']!r} target {target['refId']}"
            out.append(read_promql(target["expr"], where))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            text = var["query"]
            text = text["query"] if isinstance(text, dict) else text
            out.append(read_variable(text, f"variable ${var['name']}"))
    return out


# ---------------------------------------------------------------- what the gateway serves

_SERIES_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}


def family_of(series: str, families: Mapping[str, Metric]) -> Metric | None:
    """The family whose series ``series`` is, as prometheus-client's text parser names
    families: a counter ``x`` serves ``x_total``, a histogram ``x`` serves ``x_bucket``,
    ``x_count`` and ``x_sum``; a gauge ``x_count`` is a family of its own; the bare name of
    a counter or histogram is no series at all."""
    exact = families.get(series)
    if exact is not None and "" in _SERIES_SUFFIXES.get(exact.type, ("",)):
        return exact  # a gauge (or summary) of that very name: ``x_created`` of a histogram
    for name, family in families.items():
        suffixes = _SERIES_SUFFIXES.get(family.type, ("",))
        if any(series == name + suffix for suffix in suffixes if suffix):
            return family
    return None


def series_labels(series: str, family: Metric) -> set[str]:
    """The labels ``series`` carries in the scrape (its samples'), and the target labels."""
    labels = {label for s in family.samples if s.name == series for label in s.labels}
    return labels | TARGET_LABELS | {"__name__"}


def problems(query: Query, families: Mapping[str, Metric]) -> list[str]:
    """What in ``query`` the scraped ``families`` do not serve: a series of no family, a
    family with no sample to check it on, a matched or grouped label its series lack."""
    found = list(query.errors)
    if not query.selectors and not query.errors:
        found.append(f"{query.where}: names no series")
    resolved: dict[str, Metric] = {}
    for selector in query.selectors:
        family = family_of(selector.series, families)
        if family is None:
            found.append(f"{query.where}: {selector.series} is no series the gateway serves")
            continue
        if not any(s.name == selector.series for s in family.samples):
            found.append(
                f"{query.where}: {selector.series} (family {family.name}) has no samples, "
                "so its labels cannot be checked: the traffic should make it appear"
            )
            continue
        resolved[selector.series] = family
        missing = selector.labels() - series_labels(selector.series, family)
        if missing:
            found.append(f"{query.where}: {selector.series} has no label {sorted(missing)}")
    for series, family in resolved.items():
        missing = query.grouping - series_labels(series, family)
        if missing:
            found.append(f"{query.where}: groups by {sorted(missing)}, not labels of {series}")
    return found


# ---------------------------------------------------------------- a real gateway, real traffic


def _chat(http: httpx2.Client, session: str, words: int, stem: str, **claim: str) -> Any:
    claims = [{"object_id": "@prompt", "protection_mode": "hard_protected", **claim}]
    return http.post(
        "/v1/chat/completions",
        json={
            "model": "m",
            "messages": [{"role": "user", "content": " ".join(f"{stem}{j}" for j in range(words))}],
            "agentclaims": {"session_id": session, "claims": claims if claim else []},
        },
    )


def _decision(reply: Any) -> str:
    assert reply.status_code == 200, reply.text
    decision: str = reply.json()["agentclaims"]["decisions"][0]["decision"]
    return decision


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Metric]:
    """``/metrics`` of a gateway with keys and a ledger, after: a claim left live by an
    earlier gateway on the same ledger (harmed, ``backend_restart``, on restart); a claim
    accepted, one demoted under pressure, one refused over the tenant's limit, one
    released; an active request refused (409)."""
    folder = tmp_path_factory.mktemp("grafana")
    keys = folder / "keys.toml"
    keys.write_text(KEYS)
    ledger = folder / "ledger.sqlite"
    args = ("--api-keys", str(keys), "--ledger", str(ledger), "--blocks", "24", "--block-size", "4")
    alpha_auth = {"Authorization": f"Bearer {ALPHA}"}
    with gateway_process(*args) as url, httpx2.Client(base_url=url, headers=alpha_auth) as alpha:
        assert _decision(_chat(alpha, "before", 8, "b", claim_id="left-live")) == "accepted"
    with gateway_process(*args) as url, httpx2.Client(base_url=url, headers=alpha_auth) as alpha:
        assert _decision(_chat(alpha, "s1", 6, "h", claim_id="hard")) == "accepted"
        demotable = _chat(alpha, "s2", 30, "d", claim_id="dem", protection_mode="demotable")
        assert _decision(demotable) == "accepted"
        over = _chat(alpha, "s3", 2, "o", claim_id="over", protection_mode="best_effort")
        assert _decision(over) == "rejected"  # alpha may hold 2 claims
        assert _chat(alpha, "s4", 60, "p").status_code == 200  # pressure: demotes "dem"
        refused = _chat(alpha, "s5", 400, "z")
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["type"] == "active_request_refused"
        released = alpha.post("/v1/claims/hard/release", json={"owner_scope": "s1"})
        assert released.status_code == 200, released.text
        with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {OPS}"}) as ops:
            scrape = ops.get("/metrics")
    assert scrape.status_code == 200, scrape.text
    assert scrape.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(scrape.text)}


# ---------------------------------------------------------------- the tests


def test_the_dashboard_is_an_importable_grafana_dashboard() -> None:
    dashboard = load()
    assert dashboard["title"]
    assert dashboard["uid"] == "agentclaims-gateway"
    assert isinstance(dashboard["schemaVersion"], int)
    assert dashboard["schemaVersion"] >= 36  # Grafana 9.x and later; 39 is Grafana 10.4 / 11
    [ds_input] = dashboard["__inputs"]
    assert ds_input["name"] == "DS_PROMETHEUS"
    assert (ds_input["type"], ds_input["pluginId"]) == ("datasource", "prometheus")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "instance", "tenant"}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == (
        "datasource",
        "prometheus",
    )
    assert "${DS_PROMETHEUS}" in json.dumps(variables["datasource"]["current"])
    for name in ("instance", "tenant"):
        assert variables[name]["type"] == "query"
        assert variables[name]["query"].startswith("label_values(")
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    panels = list(all_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert any(p["type"] == "row" and p["collapsed"] and p["panels"] for p in panels)
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 20
    for panel in panels:
        assert isinstance(panel["id"], int), panel
        assert panel["title"], panel
        assert panel["type"] in ("row", "timeseries", "stat", "bargauge", "table"), panel
        assert panel["description"].strip(), f"panel {panel['title']!r} has no description"
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["refId"], panel["title"]
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"] == panel["datasource"], panel["title"]


def test_every_family_and_label_the_dashboard_names_is_served(
    families: dict[str, Metric],
) -> None:
    queries = dashboard_queries(load())
    found = [p for q in queries for p in problems(q, families)]
    assert not found, "\n".join(found)
    served = [family_of(s, families) for q in queries for s in q.series()]
    named = {f.name for f in served if f is not None}
    # the dashboard covers what operators look at (and the test's traffic made it appear)
    assert {
        "agentclaims_gateway_calls",
        "agentclaims_request_seconds",
        "agentclaims_gateway_errors",
        "agentclaims_active_requests",
        "agentclaims_claims",
        "agentclaims_engine_claims_accepted",
        "agentclaims_engine_claims_rejected",
        "agentclaims_tenant_claims_refused",
        "agentclaims_tenant_live_claims",
        "agentclaims_tenant_protected_blocks",
        "agentclaims_claims_harmed",
        "agentclaims_claims_demoted",
        "agentclaims_claims_expired",
        "agentclaims_pool_blocks",
        "agentclaims_ledger_writes",
        "agentclaims_ledger_write_seconds",
    } <= named


def test_every_panel_follows_the_instance_and_tenant_pickers(families: dict[str, Metric]) -> None:
    dashboard = load()
    for panel in all_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            query = read_promql(target["expr"], f"panel {panel['title']!r}")
            for selector in query.selectors:
                matched = {(label, op, v) for label, op, v in selector.matchers}
                assert ("instance", "=~", "$instance") in matched, (query.where, selector)
                family = family_of(selector.series, families)
                assert family is not None, selector
                if "tenant" in series_labels(selector.series, family) - TARGET_LABELS:
                    assert ("tenant", "=~", "$tenant") in matched, (query.where, selector)


def test_the_reader_finds_metric_names_not_functions_labels_or_keywords() -> None:
    q = read_promql(
        'histogram_quantile(0.99, sum by (le, route) (rate(a_seconds_bucket{instance=~"$i",'
        ' route!="GET /health"}[$__rate_interval]))) > bool 0.5 and on (instance) '
        "sum without (kind) (b_blocks offset 5m) / ignoring (x) group_left (y) "
        'max(c_total[5m:1m] @ end()) or {__name__="d_total", tenant="t"} unless inf',
        "q",
    )
    assert q.errors == []
    assert [s.series for s in q.selectors] == ["a_seconds_bucket", "b_blocks", "c_total", "d_total"]
    assert q.selectors[0].matchers == (("instance", "=~", "$i"), ("route", "!=", "GET /health"))
    assert q.selectors[3].labels() == {"__name__", "tenant"}
    assert q.grouping == {"le", "route", "instance", "kind", "x", "y"}
    v = read_variable('label_values(e_total{instance=~"$instance"}, tenant)', "v")
    assert (v.series(), v.grouping) == ({"e_total"}, {"tenant"})
    # what it cannot vouch for is an error, never a pass
    assert read_promql("rat(a_total[5m])", "typo").errors == ["typo: rat() is no PromQL function"]
    assert read_promql("sum(a_total{tenant=5})", "m").errors
    assert read_promql("a_total # b", "c").errors
    assert read_variable("label_values(tenant)", "w").errors
    assert read_variable("metrics(agentclaims_.*)", "w").errors


def test_series_resolve_to_families_as_the_text_parser_names_them() -> None:
    text = (
        "# TYPE a_total counter\na_total 1\n"
        '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_count 1\nh_sum 1\n'
        "# TYPE h_created gauge\nh_created 1\n"
        "# TYPE g_count gauge\ng_count 1\n"
    )
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(parsed) == {"a", "h", "h_created", "g_count"}
    resolved = {
        s: getattr(family_of(s, parsed), "name", None)
        for s in (
            "a_total",
            "a",
            "h_bucket",
            "h_count",
            "h_sum",
            "h",
            "h_created",
            "g_count",
            "g",
            "a_sum",
        )
    }
    assert resolved == {
        "a_total": "a",
        "a": None,  # a counter's bare name selects nothing in Prometheus
        "h_bucket": "h",
        "h_count": "h",
        "h_sum": "h",
        "h": None,
        "h_created": "h_created",
        "g_count": "g_count",  # a gauge's name is its series, suffix or not
        "g": None,
        "a_sum": None,
    }
    assert series_labels("h_bucket", parsed["h"]) - TARGET_LABELS == {"le", "__name__"}
    assert series_labels("h_count", parsed["h"]) - TARGET_LABELS == {"__name__"}


def test_a_family_or_label_the_gateway_does_not_serve_is_reported(
    families: dict[str, Metric],
) -> None:
    def check(expr: str) -> list[str]:
        return problems(read_promql(expr, "q"), families)

    assert check("sum(rate(agentclaims_gateway_calls_total[5m]))") == []
    assert check("rate(agentclaims_no_such_family_total[5m])") == [
        "q: agentclaims_no_such_family_total is no series the gateway serves"
    ]
    assert check("rate(agentclaims_gateway_calls[5m])")  # a counter without _total
    assert check("agentclaims_request_seconds")  # a histogram without _bucket/_sum/_count
    assert check('agentclaims_pool_blocks{tenant="alpha"}') == [
        "q: agentclaims_pool_blocks has no label ['tenant']"
    ]
    assert check("sum by (cause) (agentclaims_claims_demoted_total)") == [
        "q: groups by ['cause'], not labels of agentclaims_claims_demoted_total"
    ]
    assert check(
        "histogram_quantile(0.9, sum by (le) (rate(agentclaims_request_seconds_count[5m])))"
    )
    assert check("vector(1)") == ["q: names no series"]
    # and the dashboard's own queries, so broken, are caught
    broken = json.loads(
        json.dumps(load()).replace("agentclaims_tenant_live_claims", "agentclaims_tenant_live")
    )
    found = [p for q in dashboard_queries(broken) for p in problems(q, families)]
    assert found == [
        "panel 'Live claims by tenant' target A: agentclaims_tenant_live is no series the gateway serves"
    ]
