"""verify's message sizes (pure): per signature, the gRPC request and answer at each batch size verify tried,
computed from the inputs it sent and the outputs it got (serving/messages.py: the wire format, exact), and the most
rows an answer may hold for a default gRPC client (4 MiB) and for TF Serving's server (2 GiB), extrapolated from
the bytes per row.

Over the default client's limit is a warning (TF Serving sends the answer; the client refuses it, and one channel
option fixes that); over the server's own limit an error (no client option helps).
"""
from __future__ import annotations

import numpy as np

from exportkit.findings import Finding
from exportkit.report.format import scaled, size_text as decimal_size
from exportkit.serving.messages import (CLIENT_MAX_RECEIVE, RECEIVE_OPTION, SERVER_MAX_MESSAGE, ModelSpec,
                                        request_bytes, response_bytes, rows_within, tensor_bytes)

CODE = "message-size"


def size_text(n: float | None) -> str:
    """`9.6 MB (9.16 MiB)`: decimal units (report.format.size_text), and binary ones beside them from 1 MB on, since
    the limits are binary (4 MiB = 4,194,304 bytes)."""
    if n is None or n < 10**6:
        return decimal_size(None if n is None else int(n))
    return f"{decimal_size(int(n))} ({scaled(n, (('MiB', 2**20), ('GiB', 2**30), ('TiB', 2**40)))})"


def _rows(batch: dict) -> int:
    return max((len(v) for v in batch.values() if np.ndim(v)), default=0)


def _empty(outputs: dict, rows: int) -> dict:
    """The outputs with their batch dimension cut to 0 rows (what does not grow with the batch stays)."""
    return {k: v[:0] if np.ndim(v) and len(v) == rows else v for k, v in outputs.items()}


def signature_sizes(name: str, api: str, batches: list[dict], answers: list[dict | None], spec: ModelSpec) -> dict:
    """{"signature", "api", "batches": [{"rows", "request_bytes", "response_bytes"}] (per batch size, the largest),
    "response_bytes_fixed", "response_bytes_per_row", "outputs_per_row": {output: bytes}, "rows_within":
    {"default_client", "server"}}. `answers`: the outputs of each batch (None where no runtime answered)."""
    by_rows: dict[int, dict] = {}
    fixed, per_row, outputs_per_row, top = None, 0.0, {}, 0
    for batch, answer in zip(batches, answers):
        rows = _rows(batch)
        seen = by_rows.setdefault(rows, {"rows": rows, "request_bytes": 0, "response_bytes": None})
        seen["request_bytes"] = max(seen["request_bytes"], request_bytes(api, batch, spec))
        if answer is None or not rows:
            continue
        size = response_bytes(api, answer, spec)
        seen["response_bytes"] = max(seen["response_bytes"] or 0, size)
        if fixed is None:
            fixed = response_bytes(api, _empty(answer, rows), spec)
        per_row = max(per_row, (size - fixed) / rows)
        if rows >= top:
            top = rows
            outputs_per_row = {k: tensor_bytes(v) / rows for k, v in answer.items()}
    return {"signature": name, "api": api, "batches": [by_rows[r] for r in sorted(by_rows)],
            "response_bytes_fixed": fixed, "response_bytes_per_row": per_row or None,
            "outputs_per_row": outputs_per_row,
            "rows_within": {"default_client": rows_within(CLIENT_MAX_RECEIVE, fixed or 0, per_row),
                            "server": rows_within(SERVER_MAX_MESSAGE, fixed or 0, per_row)}}


def _channel_option(n: int) -> str:
    """The client's channel option for answers of up to n bytes, in MiB as people write it."""
    mib = -(-n // 2**20)
    return f'options=[("{RECEIVE_OPTION}", {mib} * 1024 * 1024)]'


def size_findings(sizes: dict) -> list[Finding]:
    """An error for a message over TF Serving's server limit, a warning for an answer over a default client's."""
    name, api, within = sizes["signature"], sizes["api"], sizes["rows_within"]
    found = []
    for b in sizes["batches"]:
        what, size = max((("request", b["request_bytes"]), ("answer", b["response_bytes"] or 0)), key=lambda x: x[1])
        if size > SERVER_MAX_MESSAGE:
            found.append(Finding("error", CODE, (
                f"signature '{name}': the {api} {what} of a batch of {b['rows']} is {size_text(size)}, over the "
                f"{SERVER_MAX_MESSAGE:,} bytes (2 GiB) TF Serving's gRPC server "
                f"{'accepts' if what == 'request' else 'sends'} (SetMaxMessageSize(INT32_MAX), "
                f"model_servers/server.cc): the call fails with RESOURCE_EXHAUSTED whatever the client sets. fix: "
                f"send at most {within['server']} rows per request")))
            break
    over_client = [b for b in sizes["batches"] if (b["response_bytes"] or 0) > CLIENT_MAX_RECEIVE]
    if over_client:
        b, n = over_client[-1], within["default_client"]
        key, out = max(sizes["outputs_per_row"].items(), key=lambda kv: kv[1], default=(None, 0))
        output = f" (output '{key}': {size_text(out)} per row)" if key else ""
        fits = (f"a default client receives at most {n} row{'s' if n != 1 else ''} per request" if n else
                "a default client cannot receive even one row")
        fix = f"create the client's channel with {_channel_option(b['response_bytes'])} (-1: no limit)"
        found.append(Finding("warning", CODE, (
            f"signature '{name}': the {api} answer to a batch of {b['rows']} is {size_text(b['response_bytes'])}"
            f"{output}, over the 4 MiB ({CLIENT_MAX_RECEIVE:,} bytes) a default gRPC client receives: it gets "
            f"RESOURCE_EXHAUSTED \"Received message larger than max\" though TF Serving sent the answer; {fits}. "
            f"fix: {fix}" + (f", or send at most {n} rows per request" if n else ""))))
    return found


MESSAGE_HEADERS = ("SIGNATURE", "API", "ROWS", "REQUEST", "ANSWER", "ANSWER PER ROW", "DEFAULT CLIENT RECEIVES")


def message_rows(messages: list[dict]) -> list[tuple[str, ...]]:
    """One row per signature, at the largest batch verify tried, for the text, HTML and Markdown reports."""
    rows = []
    for m in messages:
        b = m["batches"][-1] if m["batches"] else {}
        n = m["rows_within"]["default_client"]
        rows.append((m["signature"], m["api"], str(b.get("rows", "-")), size_text(b.get("request_bytes")),
                     size_text(b.get("response_bytes")), size_text(m["response_bytes_per_row"]),
                     "-" if n is None else f"up to {n:,} row{'s' if n != 1 else ''}"))
    return rows
