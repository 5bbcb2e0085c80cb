"""TF Serving's metrics, and the Prometheus page it writes of them (util/prometheus_exporter.cc).

The metrics are the ones TF Serving and the TF core under it define, with their names and labels:
- `/tensorflow/serving/request_count` {model_name, status}: every Predict/Classify/Regress over gRPC
  (model_servers/prediction_service_impl.cc) and every REST request (model_servers/http_server.cc), by its final
  status (servables/tensorflow/util.cc RecordModelRequestCount);
- `/tensorflow/serving/request_latency` {model_name, API, entrypoint}: the same requests, successful ones only;
- `/tensorflow/serving/runtime_latency` {model_name, API, runtime}: the Session::Run inside them (predict_util.cc);
- `/tensorflow/cc/saved_model/load_attempt_count` {model_path, status "success"|"fail"} and
  `/tensorflow/cc/saved_model/load_latency` {model_path} (microseconds, successful loads): TF core's loader.cc;
- `/tensorflow/serving/model_warmup_latency` {model_path, status} (saved_model_warmup_util.cc).
TF Serving defines no per-version state metric: a version's state is what GetModelStatus answers.

The page is written here, byte for byte as PrometheusExporter::GeneratePage does, not by prometheus-client (which
appends `_total` to counters and adds `_created` samples TF Serving never writes): `/` becomes `:`, one `# TYPE`
line per metric (no HELP), metrics sorted by their TF name, a histogram's buckets cumulative and upper-exclusive
as tsl's Histogram counts them (a value equal to a limit goes to the next bucket), the last one `+Inf`.
"""
from __future__ import annotations

import bisect
import re
import threading

# monitoring::Buckets::Exponential(10, 1.8, 33), in microseconds; tsl's Histogram adds DBL_MAX (printed +Inf)
LATENCY_BUCKETS = tuple(10 * 1.8 ** i for i in range(33))


def _number(value: float) -> str:
    """absl::StrCat of a double: six significant digits, as %g prints them."""
    return f"{value:.6g}"


def prometheus_name(name: str) -> str:
    """GetPrometheusMetricName: every character outside [a-zA-Z0-9_] becomes ':'; a leading digit gets '_'."""
    name = re.sub(r"[^a-zA-Z0-9_]", ":", name)
    return "_" + name if name[:1].isdigit() else name


def _label_name(name: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9]", "_", name)
    return "_" + name if name[:1].isdigit() else name


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> list[str]:
    """SanatizeLabelName / SanitizeLabelValue: backslash and double quote escaped."""
    return [f'{_label_name(n)}="' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for n, v in zip(names, values)]


class Counter:
    """monitoring::Counter<N>: an int64 per label tuple."""

    kind = "counter"

    def __init__(self, name: str, *labels: str):
        self.name, self.labels = name, labels
        self.cells: dict[tuple[str, ...], int] = {}

    def add(self, values: tuple[str, ...], by: int = 1) -> None:
        self.cells[values] = self.cells.get(values, 0) + int(by)

    def lines(self) -> list[str]:
        name = prometheus_name(self.name)
        return [f"# TYPE {name} counter"] + [
            f"{name}{{{','.join(_labels(self.labels, values))}}} {count}" for values, count in sorted(self.cells.items())]


class Sampler:
    """monitoring::Sampler<N>: a histogram per label tuple over fixed bucket limits (+ DBL_MAX)."""

    kind = "histogram"

    def __init__(self, name: str, *labels: str, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.name, self.labels, self.limits = name, labels, tuple(buckets)
        self.cells: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def add(self, values: tuple[str, ...], sample: float) -> None:
        counts, total = self.cells.setdefault(values, ([0] * (len(self.limits) + 1), [0.0]))
        counts[bisect.bisect_right(self.limits, sample)] += 1  # bucket i holds [limit[i-1], limit[i])
        total[0] += sample

    def lines(self) -> list[str]:
        name = prometheus_name(self.name)
        out = [f"# TYPE {name} histogram"]
        for values, (counts, total) in sorted(self.cells.items()):
            labels = _labels(self.labels, values)
            prefix = f"{name}_bucket{{{','.join(labels)}{',' if labels else ''}"
            cumulative = 0
            for i, count in enumerate(counts):
                cumulative += count
                limit = _number(self.limits[i]) if i < len(self.limits) else "+Inf"
                out.append(f'{prefix}le="{limit}"}} {cumulative}')
            out.append(f"{name}_sum{{{','.join(labels)}}} {_number(total[0])}")
            out.append(f"{name}_count{{{','.join(labels)}}} {cumulative}")
        return out


def generate_page(metrics: list) -> str:
    """PrometheusExporter::GeneratePage over `metrics` (Counter/Sampler): sorted by TF name, '\\n'-joined."""
    lines = []
    for metric in sorted(metrics, key=lambda m: m.name):
        lines += metric.lines()
    return "\n".join(lines) + "\n"


class Metrics:
    """The server's metrics (the ones listed above) and its Prometheus page at `path`."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self.request_count = Counter("/tensorflow/serving/request_count", "model_name", "status")
        self.request_latency = Sampler("/tensorflow/serving/request_latency", "model_name", "API", "entrypoint")
        self.runtime_latency = Sampler("/tensorflow/serving/runtime_latency", "model_name", "API", "runtime")
        self.load_attempts = Counter("/tensorflow/cc/saved_model/load_attempt_count", "model_path", "status")
        self.load_latency = Counter("/tensorflow/cc/saved_model/load_latency", "model_path")
        self.warmup_latency = Sampler("/tensorflow/serving/model_warmup_latency", "model_path", "status")

    def request(self, model_name: str, api: str, entrypoint: str, status: str, micros: float) -> None:
        """RecordModelRequestCount always; RecordRequestLatency only for a request that succeeded."""
        with self._lock:
            self.request_count.add((model_name, status))
            if status == "OK":
                self.request_latency.add((model_name, api, entrypoint), micros)

    def runtime(self, model_name: str, api: str, micros: float) -> None:
        with self._lock:
            self.runtime_latency.add((model_name, api, "TF1"), micros)

    def load(self, model_path: str, ok: bool, micros: float) -> None:
        with self._lock:
            self.load_attempts.add((model_path, "success" if ok else "fail"))
            if ok:
                self.load_latency.add((model_path,), micros)

    def warmup(self, model_path: str, status: str, micros: float) -> None:
        with self._lock:
            self.warmup_latency.add((model_path, status), micros)

    def render(self) -> bytes:
        with self._lock:
            return generate_page([self.request_count, self.request_latency, self.runtime_latency,
                                  self.load_attempts, self.load_latency, self.warmup_latency]).encode("utf-8")
