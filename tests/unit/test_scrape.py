"""tests/support/scrape.py reads an exposition as Prometheus does, where a split on spaces
and quotes would not."""

from __future__ import annotations

from tests.support.scrape import buckets, label_values, metric_sum, samples

TEXT = r"""# HELP tokengate_requests_total Answers by status.
# TYPE tokengate_requests_total counter
tokengate_requests_total{domain="a",model="m \"q\" } 9",status="200"} 3.0
tokengate_requests_total{domain="b",model="m",status="429"} 2.0
# HELP tokengate_queue_wait_seconds Time waiting for a slot.
# TYPE tokengate_queue_wait_seconds histogram
tokengate_queue_wait_seconds_bucket{domain="a",le="0.5"} 1.0
tokengate_queue_wait_seconds_bucket{domain="a",le="+Inf"} 4.0
tokengate_queue_wait_seconds_count{domain="a"} 4.0
tokengate_queue_wait_seconds_sum{domain="a"} 2.5
# HELP tokengate_redis_up Redis answers.
# TYPE tokengate_redis_up gauge
tokengate_redis_up 1.0
"""


def test_samples_are_matched_by_exposed_name_and_a_subset_of_labels() -> None:
    assert metric_sum(TEXT, "tokengate_requests_total") == 5.0
    assert metric_sum(TEXT, "tokengate_requests_total", status="429") == 2.0
    assert metric_sum(TEXT, "tokengate_requests_total", domain="nowhere") == 0.0
    assert metric_sum(TEXT, "tokengate_redis_up") == 1.0
    (odd,) = samples(TEXT, "tokengate_requests_total", domain="a")
    assert odd.labels["model"] == 'm "q" } 9'  # escaped quotes and a brace in a value
    assert buckets(TEXT, "tokengate_queue_wait_seconds", domain="a") == {
        0.5: 1.0,
        float("inf"): 4.0,
    }
    assert metric_sum(TEXT, "tokengate_queue_wait_seconds_count") == 4.0
    assert label_values(TEXT, "domain") == {"a", "b"}
