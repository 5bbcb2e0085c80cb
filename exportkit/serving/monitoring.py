"""TF Serving's metrics (servables/tensorflow/util.cc) in Prometheus text (util/prometheus_exporter.cc), served on
the REST port at the MonitoringConfig's path. TF Serving's names `/tensorflow/serving/request_count` become
`:tensorflow:serving:request_count` there; prometheus-client writes the counter's samples with `_total` appended.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

# monitoring::Buckets::Exponential(10, 1.8, 33), in microseconds
LATENCY_BUCKETS = tuple(10 * 1.8 ** i for i in range(33))


class Metrics:
    def __init__(self, path: str):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.path = path
        self.registry = CollectorRegistry()
        self.request_count = Counter(":tensorflow:serving:request_count", "The total number of requests.",
                                     ["model_name", "status"], registry=self.registry)
        self.request_latency = Histogram(
            ":tensorflow:serving:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            ["model_name", "API", "entrypoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.load_attempts = Counter(":tensorflow:cc:saved_model:load_attempt_count",
                                     "The number of times a SavedModel was successfully loaded.",
                                     ["model_path", "status"], registry=self.registry)

    @contextmanager
    def request(self, model_name: str, api: str, entrypoint: str):
        """Count one request by its final status and record its latency."""
        from exportkit.serving.status import RpcError

        started = time.monotonic()
        status = "OK"
        try:
            yield
        except RpcError as err:
            status = err.code.name
            raise
        except Exception:
            status = "INTERNAL"
            raise
        finally:
            self.request_count.labels(model_name, status).inc()
            self.request_latency.labels(model_name, api, entrypoint).observe((time.monotonic() - started) * 1e6)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
