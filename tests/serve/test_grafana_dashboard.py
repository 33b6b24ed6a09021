"""docs/grafana-graphtop.json shows what /metrics exports: every query names metrics the collector has,
and every metric the collector has is on some panel."""

from __future__ import annotations

import json
import re

from prometheus_client import CollectorRegistry
from support.paths import REPO

from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.metrics import MetricsCollector

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",), "info": ("",)}


def exported() -> dict[str, str]:
    """``{sample name: family name}`` of every series the collector can export."""
    collector = MetricsCollector(EventBus(), CollectorRegistry())
    try:
        names = {}
        for family in collector.registry.collect():
            for suffix in SUFFIXES[family.type]:
                names[family.name + suffix] = family.name
        return names
    finally:
        collector.close()


def test_the_dashboard_queries_exactly_the_exported_metrics() -> None:
    dashboard = json.loads((REPO / "docs" / "grafana-graphtop.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = {name for q in queries for name in re.findall(r"graphtop:[a-z0-9_]+", q)}
    names = exported()
    assert used <= set(names), sorted(used - set(names))
    assert {names[n] for n in used} == set(names.values()), sorted(set(names.values()) - {names[n] for n in used})
    assert all(q.count("{") == q.count("}") and q.count("(") == q.count(")") for q in queries)
    assert all(p.get("datasource", {}).get("uid") == "${datasource}" for p in dashboard["panels"] if p["type"] != "row")
