"""Reading a `/metrics` scrape with prometheus_client's own text parser.

Tests ask for samples by their exposed name (`tokengate_requests_total`, a histogram's
`..._bucket`) and a subset of labels; the parser handles what a hand-written split gets
wrong (escaped quotes in label values, `+Inf`, exemplars, comments).
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str, name: str, **labels: str) -> list[Sample]:
    """Every sample called `name` whose labels include `labels`."""
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of those samples' values (0 when there is none)."""
    return sum((s.value for s in samples(text, name, **labels)), 0.0)


def buckets(text: str, name: str, **labels: str) -> dict[float, float]:
    """A histogram's cumulative counts by upper bound (`le`), for `name` without `_bucket`."""
    return {float(s.labels["le"]): s.value for s in samples(text, f"{name}_bucket", **labels)}


def label_values(text: str, label: str) -> set[str]:
    """Every value `label` takes in the scrape, whatever the metric."""
    return {
        s.labels[label]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if label in s.labels
    }
