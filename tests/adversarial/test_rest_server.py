"""Hostile REST clients (issue 27): each case asserts the answer (status and TF Serving's JSON error) and that the
server still answers a real Predict correctly afterwards. Process survival is checked on `exportkit serve` run
the way users run it (the CLI, SIGPIPE at its default action); the limits on an in-process server with small ones.
Bounded: at most 200 connections at once, every socket with a timeout."""
from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time

import pytest

from rest_models import MODEL, call, serve_in_process, shared_model_base

pytestmark = [pytest.mark.serving, pytest.mark.slow]

PREDICT = f"/v1/models/{MODEL}:predict"
GOOD = json.dumps({"instances": [1.0, 2.0]}).encode()


@pytest.fixture(scope="module")
def model_base(tmp_path_factory):
    return shared_model_base(tmp_path_factory)


@pytest.fixture(scope="module")
def served(model_base, tmp_path_factory):
    """`exportkit serve` in its own process: (process, REST port). It serves version 2: y = 0.5x + 3."""
    from exportkit.serving.launch.process import free_port
    from exportkit.serving.server.model_server import ADDRESS_RE

    log = (tmp_path_factory.mktemp("rest_hostile_log") / "serve.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", str(model_base), "--port", "0",
                             "--rest-port", str(free_port()), "--model-name", MODEL],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        match = ADDRESS_RE.match(proc.stdout.readline())
        assert match and match.group("rest"), _log(log)
        yield proc, int(match.group("rest").rsplit(":", 1)[1]), log
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def limited(model_base):
    """An in-process REST server with small limits: 1 s for the headers, 2 s for a body (1 s idle), 4 KiB of body,
    8 connections."""
    server, port, versions = serve_in_process(model_base, header_seconds=1.0, body_idle_seconds=1.0,
                                              body_seconds=2.0, max_body_bytes=4096, max_connections=8)
    yield port
    server.shutdown()
    server.server_close()
    for version in versions:
        version.close()


def _log(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()


def _still_serving(port: int, proc=None, log=None) -> None:
    status, _, body = call(port, "POST", PREDICT, body=GOOD, timeout=30)
    assert status == 200 and json.loads(body) == {"predictions": [3.5, 4.0]}, body
    if proc is not None:
        assert proc.poll() is None, _log(log)


def _raw(port: int, data: bytes, timeout: float = 20) -> bytes:
    """Send `data` on one connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _answers(raw: bytes) -> list[tuple[int, dict]]:
    """Every HTTP response in `raw`: (status, JSON body) each."""
    out = []
    for part in raw.split(b"HTTP/1.1 ")[1:]:
        head, _, body = part.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        out.append((int(head[:3]), json.loads(body[:length]) if length else {}))
    return out


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): the server's next write meets EPIPE/ECONNRESET."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_clients_that_leave_before_the_answer_do_not_kill_the_server(served):
    """Clients that close right after the request (the server's second write after the close meets EPIPE, which
    was SIGPIPE and exit -13), and clients that reset once a ~1 MB answer has begun."""
    import select

    proc, port, log = served
    big = json.dumps({"instances": [[float(i)] * 512 for i in range(256)]}).encode()
    for body, wait in [(GOOD, False)] * 6 + [(big, True)] * 4:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (PREDICT.encode(), len(body), body))
        if wait:
            assert select.select([sock], [], [], 60)[0], "no answer began within 60 s"
            time.sleep(0.2)  # the server is blocked in a write of the rest
            _reset(sock)
        else:
            sock.close()
        assert proc.poll() is None, _log(log)
    time.sleep(1)
    _still_serving(port, proc, log)


def test_200_stalled_clients_neither_kill_nor_block_the_server(served):
    proc, port, log = served
    stalled = []
    try:
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\n")  # headers never finished
            stalled.append(sock)
        started = time.monotonic()
        _still_serving(port, proc, log)
        assert time.monotonic() - started < 10
    finally:
        for i, sock in enumerate(stalled):
            _reset(sock) if i % 2 else sock.close()
    time.sleep(0.5)
    _still_serving(port, proc, log)


@pytest.mark.parametrize("length", ["-5", "abc", "1e13", "5, 6", "+5"])
def test_bad_content_length_is_400_and_smuggles_nothing(served, length):
    """The bytes after the head of a request with a bad length are not read as a second request."""
    proc, port, log = served
    second = f"GET /v1/models/{MODEL} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    raw = _raw(port, f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode() + second)
    answers = _answers(raw)
    assert len(answers) == 1, raw
    status, body = answers[0]
    assert status == 400 and "Content-Length" in body["error"], raw
    _still_serving(port, proc, log)


def test_content_length_and_chunked_together_is_refused(served):
    proc, port, log = served
    raw = _raw(port, f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
                     f"0\r\n\r\n".encode())
    assert [status for status, _ in _answers(raw)] == [400], raw
    _still_serving(port, proc, log)


def test_chunked_body_is_read(served):
    proc, port, log = served
    half = len(GOOD) // 2
    chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, GOOD[:half], len(GOOD) - half, GOOD[half:])
    raw = _raw(port, f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
               .encode() + chunks)
    assert _answers(raw) == [(200, {"predictions": [3.5, 4.0]})], raw


def test_gzip_bodies_are_uncompressed_and_bounded(served, limited):
    import gzip

    proc, port, log = served
    status, _, body = call(port, "POST", PREDICT, body=gzip.compress(GOOD), headers={"Content-Encoding": "gzip"})
    assert status == 200 and json.loads(body) == {"predictions": [3.5, 4.0]}
    status, _, body = call(port, "POST", PREDICT, body=b"not gzip", headers={"Content-Encoding": "gzip"})
    assert status == 400 and "Failed to uncompress the gzipped body" in json.loads(body)["error"]
    bomb = gzip.compress(b" " * 3_000_000 + b"{}")  # 3 MB in 3 KB: under the 4 KiB limit until uncompressed
    assert len(bomb) < 4096
    status, _, body = call(limited, "POST", PREDICT, body=bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413 and "uncompresses to more than" in json.loads(body)["error"]
    _still_serving(port, proc, log)


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_get_tf_servings_json_error(served, method):
    proc, port, log = served
    status, headers, body = call(port, method, PREDICT, body=GOOD)
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["error"] in (f"Malformed request: {method} {PREDICT}",
                                         "Origin header is missing in CORS preflight")
    status, _, body = call(port, "HEAD", PREDICT)
    assert status == 400 and body == ""  # HEAD: the status without the body
    _still_serving(port, proc, log)


def test_deep_json_and_garbage_do_not_hurt_the_server(served):
    proc, port, log = served
    for body, words in [(b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "rank 99999"),
                        (b'{"instances": ' + b"[" * 990 + b"1.0" + b"]" * 990 + b"}", "rank 989"),
                        (b"\xff\xfe{", "Invalid encoding"), (b"{" * 1000, "JSON Parse error")]:
        status, _, text = call(port, "POST", PREDICT, body=body, timeout=60)
        assert status == 400 and words in json.loads(text)["error"], text[:300]
    _still_serving(port, proc, log)


def test_headers_must_arrive_in_time(limited):
    started = time.monotonic()
    raw = _raw(limited, b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\n")
    assert _answers(raw) == [(408, {"error": "Request headers not received within 1 s"})]
    assert time.monotonic() - started < 5
    with socket.create_connection(("127.0.0.1", limited), timeout=10) as sock:  # an idle connection: just closed
        assert sock.recv(100) == b""
    _still_serving(limited)


def test_a_trickled_body_is_bounded_as_a_whole(limited):
    """One byte every 0.4 s never trips the 1 s idle timeout; the 2 s deadline for the whole body cuts it off."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", limited), timeout=10) as sock:
        sock.sendall(f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".encode())
        try:
            for _ in range(20):  # at most 8 s; the server answers after about 2 s
                sock.sendall(b" ")
                time.sleep(0.4)
        except OSError:  # the server answered and closed while we were still sending
            pass
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    assert _answers(raw) == [(408, {"error": "Request body not received whole within 2 s"})]
    assert time.monotonic() - started < 6
    _still_serving(limited)


def test_body_size_and_header_size_are_bounded(limited):
    raw = _raw(limited, f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000000\r\n\r\n".encode())
    assert [status for status, _ in _answers(raw)] == [413]
    chunk = b"x" * 3000
    raw = _raw(limited, f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
               + b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2 + b"0\r\n\r\n")
    assert [status for status, _ in _answers(raw)] == [413]
    raw = _raw(limited, f"GET /v1/models/{MODEL} HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * 70000}\r\n\r\n".encode())
    assert [status for status, _ in _answers(raw)] == [431]
    _still_serving(limited)


def test_connections_are_bounded(limited):
    held = [socket.create_connection(("127.0.0.1", limited), timeout=10) for _ in range(8)]
    try:
        time.sleep(0.2)
        raw = _raw(limited, b"GET /v1/models/x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert [status for status, _ in _answers(raw)] == [503]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    _still_serving(limited)
