"""The Grafana dashboard the chart ships, the metric names its queries read, and the metric
names a Prometheus text exposition offers (for checking one against the other)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "helm" / "foldgate" / "dashboards" / "foldgate.json"
)
# The dashboard writes every metric with a selector (`name{...}`), so a name is whatever an
# opening brace follows; label names inside the braces are followed by `=`, never `{`.
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{")
# Per family type, the sample names Prometheus stores for a family called `name`.
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
    "unknown": ("",),
}


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets and query variables."""
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["query"]["query"])
    return exprs


def metric_names(expr: str) -> set[str]:
    return set(_SELECTOR.findall(expr))


def exposed_names(exposition: str) -> set[str]:
    """Sample names a scrape of this /metrics text gives Prometheus, including those of
    labelled families that have no sample yet (declared by # TYPE)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return names
