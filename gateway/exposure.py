"""What the gateway shows a client about itself: header-safe echoes of client values, and
replica labels in place of the replicas' internal addresses.

A replica's URL is an internal address (a pod IP, a host name); clients see a label that
is stable for the replica (a keyed digest of its URL, so it cannot be reversed by trying
addresses) unless the operator turns ``debug`` on. ``/metrics`` answers without a key (a
scraper needs none), so its series carry the same labels (``LabelledMetrics``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# Printable ASCII but "%": what a percent-encoded header value may hold verbatim.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")
# Labels kept computed (an HMAC per response otherwise); far more than a pool's replicas.
_MAX_LABELS = 1024


def header_value(value: str) -> str:
    """``value`` as a response header: verbatim when it is printable ASCII, else its UTF-8
    percent-encoded (a header holds latin-1 at most, and never CR, LF or NUL)."""
    if value.isascii() and value.isprintable():
        return value
    return quote(value, safe=_HEADER_SAFE)


class ReplicaLabels:
    """Replica URL -> what a client is shown for it."""

    def __init__(self, secret: str | None, debug: bool = False) -> None:
        # Without a configured secret, labels are stable within this process only.
        self._key = secret.encode() if secret else secrets.token_bytes(16)
        self.debug = debug
        self._labels: dict[str, str] = {}  # replica URL -> label, computed once

    def label(self, url: str) -> str:
        if self.debug:
            return url
        label = self._labels.get(url)
        if label is None:
            if len(self._labels) >= _MAX_LABELS:  # replicas found by DNS come and go
                self._labels.clear()
            digest = hmac.new(self._key, url.encode(), hashlib.sha256).hexdigest()
            label = self._labels[url] = "replica-" + digest[:12]
        return label

    def hide(self, value: Any) -> Any:
        """``value`` (a JSON document) with every string under a ``replica`` key labelled."""
        if isinstance(value, dict):
            return {
                k: self.label(v) if k == "replica" and isinstance(v, str) else self.hide(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.hide(v) for v in value]
        return value


class LabelledMetrics:
    """A Prometheus collector: ``collector``'s series with each ``replica`` label's value
    (a replica's URL) as ``labels`` shows it to clients (for ``generate_latest``)."""

    def __init__(self, collector: Collector, labels: ReplicaLabels) -> None:
        self.collector = collector
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        for family in self.collector.collect():
            shown = Metric(family.name, family.documentation, family.type, family.unit)
            shown.samples = [
                sample._replace(labels=self._shown(sample.labels)) for sample in family.samples
            ]
            yield shown

    def _shown(self, labels: dict[str, str]) -> dict[str, str]:
        if "replica" not in labels:
            return labels
        return {**labels, "replica": self.labels.label(labels["replica"])}
