"""The HTTP/1.1 server under the REST API (TF Serving's util/net_http over libevent): it reads whole requests from
slow or hostile clients and hands each one to the REST handler.

- h11 (the HTTP/1.1 state machine httpcore and uvicorn use) parses: a Content-Length that is not a plain number (-5,
  abc, 1e13), or one next to Transfer-Encoding, is an error, never the start of a second request; chunked bodies
  are read; the header block is bounded.
- Bodies sent with `Content-Encoding: gzip` are uncompressed (TF Serving's default), bounded like any body.
- One thread per connection with a deadline for the headers, and for the body both an idle timeout and a deadline
  for the whole of it (a client trickling a byte a second is cut off too): a stalled client costs a sleeping
  thread until then and never blocks another; the number of connections is bounded too.
- Answers go out with MSG_NOSIGNAL: a client that left gets no SIGPIPE sent to the server (the CLI restores
  SIGPIPE's default action for `| head`, under which an ordinary write to a dead socket kills the process).
"""
from __future__ import annotations

import http
import logging
import socket
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Protocol

import h11

from exportkit.serving.json.encode import error_json

log = logging.getLogger("exportkit.serve")


@dataclass(frozen=True)
class Limits:
    header_seconds: float = 30.0  # from the connection's (or the previous answer's) end to the last header byte
    body_idle_seconds: float = 60.0  # longest wait for the next body bytes
    body_seconds: float = 300.0  # from the last header byte to the last body byte, however the bytes trickle
    send_seconds: float = 60.0  # longest wait for a client to take the next bytes of an answer
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 256 * 1024 * 1024
    max_connections: int = 512


class BodyReader(Protocol):
    def feed(self, data: bytes) -> None:
        """The body's next bytes, as they arrive: what is done with them overlaps the client's sending."""


@dataclass(frozen=True)
class Request:
    method: str  # upper case, as sent
    target: str  # path and query, as sent
    headers: dict[str, str]  # lower-case names
    body: bytes
    reader: BodyReader | None = None  # the handler's reader, fed the whole body


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = "application/json"


class Handler(Protocol):
    def check(self, method: str, target: str) -> Response | None:
        """An answer from the request line alone (then the body is never read), or None to read it."""

    def reader(self, method: str, target: str, headers: dict[str, str]) -> BodyReader | None:
        """Something to read the (declared, uncompressed) body as it arrives, or None."""

    def __call__(self, request: Request) -> Response:
        """The answer to a whole request."""


class _ClientGone(Exception):
    """The client closed, reset or stopped reading: nobody is left to answer."""


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str) -> Response:
    return Response(status, error_json(message).encode("utf-8"))


class HttpServer:
    """Listens on 127.0.0.1:port (0 = a free port); `serve_forever` in a thread, `shutdown` from another."""

    def __init__(self, handler: Handler, port: int, limits: Limits = Limits()):
        self.handler = handler
        self.limits = limits
        self._socket = socket.create_server(("127.0.0.1", port), backlog=128)
        self._socket.settimeout(0.2)  # how often the accept loop looks at the stop flag
        self.server_address = self._socket.getsockname()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._connections = threading.BoundedSemaphore(limits.max_connections)
        self._refusals = threading.BoundedSemaphore(32)

    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    client, _ = self._socket.accept()
                except TimeoutError:
                    continue
                except OSError:
                    if self._stop.is_set():
                        break
                    raise
                if not self._connections.acquire(blocking=False):
                    if self._refusals.acquire(blocking=False):  # say why, in a thread of its own (bounded too)
                        threading.Thread(target=self._refuse_busy, args=(client,), daemon=True).start()
                    else:
                        client.close()
                    continue
                try:
                    threading.Thread(target=self._serve_connection, args=(client,), daemon=True).start()
                except RuntimeError:  # no thread to be had: this client is dropped, the accept loop goes on
                    self._connections.release()
                    client.close()
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._stopped.wait(5)

    def server_close(self) -> None:
        self._socket.close()

    # ------------------------------------------------------------------------------------------------ a connection
    def _refuse_busy(self, client: socket.socket) -> None:
        with client:
            conn = h11.Connection(h11.SERVER)
            try:
                self._send(client, conn, error_response(503, f"more than {self.limits.max_connections} open "
                                                             "connections; try again later"), keep_alive=False)
                _linger(client)
            except _ClientGone:
                pass
            finally:
                self._refusals.release()

    def _serve_connection(self, client: socket.socket) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        try:
            with client:
                while self._one_exchange(client, conn):
                    conn.start_next_cycle()
        except _ClientGone:
            pass
        except Exception:  # noqa: BLE001 — one connection's bug must not reach the accept loop
            log.exception("REST connection failed")
        finally:
            self._connections.release()

    def _one_exchange(self, client: socket.socket, conn: h11.Connection) -> bool:
        """Read one request and answer it; True if the connection can carry another."""
        try:
            head = self._next_event(client, conn, time.monotonic() + self.limits.header_seconds,
                                    self.limits.header_seconds, "headers")
            if isinstance(head, h11.ConnectionClosed):
                return False
            if sum(len(name) + len(value) for name, value in head.headers) > self.limits.max_header_bytes:
                # h11 bounds only a head still incomplete; one that arrived whole in a read is bounded here
                raise _Refused(431, f"Request headers larger than {self.limits.max_header_bytes} bytes")
            early = self.handler.check(head.method.decode("ascii", "replace"),
                                       head.target.decode("ascii", "replace"))
            if early is not None:  # answered from the URL: the body is left unread, so the connection closes
                self._send(client, conn, early, keep_alive=False, head=head.method == b"HEAD")
                _linger(client)
                return False
            request = self._read_body(client, conn, head)
        except h11.RemoteProtocolError as err:
            self._refuse(client, conn, err.error_status_hint, f"Malformed HTTP request: {err}")
            return False
        except _Refused as err:
            if not (err.status == 408 and conn.their_state is h11.IDLE and not conn.trailing_data[0]):
                self._refuse(client, conn, err.status, err.message)  # not for an idle connection: just close it
            return False
        response = self.handler(request)
        self._send(client, conn, response, keep_alive=True, head=request.method == "HEAD")
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    def _read_body(self, client: socket.socket, conn: h11.Connection, head: h11.Request) -> Request:
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in head.headers}
        declared = headers.get("content-length")
        if declared is not None and "transfer-encoding" in headers:  # RFC 9112 6.1: a smuggling attempt
            raise _Refused(400, "Malformed HTTP request: both Content-Length and Transfer-Encoding given")
        if declared is not None and int(declared) > self.limits.max_body_bytes:  # h11 checked it is a number
            raise _Refused(413, f"Request body of {declared} bytes is larger than the limit of "
                                f"{self.limits.max_body_bytes} bytes")
        if conn.they_are_waiting_for_100_continue:
            self._send_bytes(client, conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        method, target = head.method.decode("ascii", "replace"), head.target.decode("ascii", "replace")
        gzip = "gzip" in headers.get("content-encoding", "").lower()  # net_http's auto_uncompress_input, on by default
        reader = None if declared is None or gzip else self.handler.reader(method, target, headers)
        chunks, size = [], 0
        deadline = time.monotonic() + self.limits.body_seconds
        while True:
            event = self._next_event(client, conn, deadline, self.limits.body_idle_seconds, "body",
                                     self.limits.body_seconds)
            if isinstance(event, h11.EndOfMessage):
                break
            if isinstance(event, h11.ConnectionClosed):
                raise _ClientGone()
            size += len(event.data)
            if size > self.limits.max_body_bytes:
                raise _Refused(413, f"Request body is larger than the limit of {self.limits.max_body_bytes} bytes")
            chunks.append(event.data)
            if reader is not None:
                try:
                    reader.feed(event.data)
                except Exception:  # noqa: BLE001 — the handler then reads the whole body its own way
                    log.exception("REST: the body reader failed; the body is read whole")
                    reader = None
        body = b"".join(chunks)
        if gzip:
            body = self._gunzip(body)
        return Request(method, target, headers, body, reader)

    def _gunzip(self, data: bytes) -> bytes:
        most = self.limits.max_body_bytes  # also what a small gzip body may grow to
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(data, most + 1)
        except zlib.error as err:
            raise _Refused(400, f"Failed to uncompress the gzipped body: {err}") from None
        if len(out) > most:
            raise _Refused(413, f"Request body uncompresses to more than the limit of {most} bytes")
        return out

    def _next_event(self, client: socket.socket, conn: h11.Connection, deadline: float, idle: float, part: str,
                    whole: float | None = None):
        """The next h11 event, reading as needed: 408 once `deadline` passes (the whole `part` took longer than
        `whole` seconds) or no byte came for `idle` seconds."""
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                client.settimeout(min(idle, left))
                data = client.recv(1 << 20)
            except TimeoutError:
                if whole is not None and deadline - time.monotonic() <= 0:
                    raise _Refused(408, f"Request {part} not received whole within {whole:g} s") from None
                raise _Refused(408, f"Request {part} not received within {idle:g} s") from None
            except OSError:
                raise _ClientGone() from None
            conn.receive_data(data)  # b"" = the client closed its side

    def _refuse(self, client: socket.socket, conn: h11.Connection, status: int, message: str) -> None:
        """Answer a request that could not be read, then close: what follows its head is not a request."""
        log.debug("REST: refused a request: %s", message)
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        try:
            self._send(client, conn, error_response(status, message), keep_alive=False)
            _linger(client)
        except (_ClientGone, h11.LocalProtocolError):
            pass

    def _send(self, client: socket.socket, conn: h11.Connection, response: Response, keep_alive: bool,
              head: bool = False) -> None:
        headers = [] if response.content_type is None else [("Content-Type", response.content_type)]
        headers.append(("Content-Length", str(len(response.body))))
        if not keep_alive:
            headers.append(("Connection", "close"))
        try:
            reason = http.HTTPStatus(response.status).phrase
        except ValueError:  # 499 CLIENT_CLOSED_REQUEST is not in the standard's list
            reason = ""
        data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
        if response.body and not head:
            data += conn.send(h11.Data(data=response.body))
        data += conn.send(h11.EndOfMessage())
        self._send_bytes(client, data)

    def _send_bytes(self, client: socket.socket, data: bytes) -> None:
        view = memoryview(data)
        client.settimeout(self.limits.send_seconds)
        try:
            while view:
                view = view[client.send(view, socket.MSG_NOSIGNAL):]
        except OSError:  # EPIPE, ECONNRESET, a timeout: the client is gone, the server is not
            raise _ClientGone() from None


def _linger(client: socket.socket, seconds: float = 1.0, most: int = 1 << 20) -> None:
    """Close our side, then read (and drop) what the client still sends for a moment: closing with unread bytes
    sends a reset, which can destroy the answer before the client reads it."""
    try:
        client.shutdown(socket.SHUT_WR)
        deadline, taken = time.monotonic() + seconds, 0
        while taken < most and (left := deadline - time.monotonic()) > 0:
            client.settimeout(left)
            data = client.recv(65536)
            if not data:
                break
            taken += len(data)
    except OSError:
        pass


def serve_in_thread(handler: Handler, port: int, limits: Limits = Limits(), name: str = "rest") -> HttpServer:
    server = HttpServer(handler, port, limits)
    threading.Thread(target=server.serve_forever, daemon=True, name=name).start()
    return server

