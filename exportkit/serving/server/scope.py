"""What one request carries through the server: its deadline and the servable versions it holds.

TF Serving passes both explicitly: the RunOptions with `timeout_in_ms` (the gRPC deadline in
prediction_service_impl.cc, `--rest_api_timeout_in_ms` in http_rest_api_handler.cc) down to Session::Run, and a
ServableHandle that keeps the version loaded until the request lets go of it (basic_manager.cc: the handle
shares the serving map, whose replacement waits for the last holder). Here the entrypoint (gRPC method, REST
request) opens a scope; `ServerCore.servable` records the versions it hands out in it and `ServedModel.run` reads
its deadline, so the APIs in between stay as TF Serving writes them.
"""
from __future__ import annotations

import contextvars
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

_current: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar("exportkit_request", default=None)


@dataclass
class RequestScope:
    deadline: float | None = None  # time.monotonic() when the request's RunOptions time out; None = never
    held: list = field(default_factory=list)  # ServedModels handed out to this request


@contextmanager
def request_scope(timeout_seconds: float | None):
    """One request: `timeout_seconds` (None or <= 0: no timeout) becomes every Session.run's RunOptions timeout;
    every version it was handed is released at the end."""
    bounded = timeout_seconds is not None and 0 < timeout_seconds < 1e9  # gRPC without a deadline: far future
    scope = RequestScope(time.monotonic() + timeout_seconds if bounded else None)
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)
        for servable in scope.held:
            servable.release()


def current() -> RequestScope | None:
    return _current.get()


def timeout_in_ms() -> int:
    """RunOptions.timeout_in_ms for a Session.run now: 0 = none (DirectSession's default); at least 1 once the
    deadline is near or gone (0 or less would mean "no timeout")."""
    scope = _current.get()
    if scope is None or scope.deadline is None:
        return 0
    return max(1, int((scope.deadline - time.monotonic()) * 1000))
