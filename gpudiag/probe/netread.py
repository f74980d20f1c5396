"""Bounded HTTP reads: every answer arrives within a deadline and a size cap, or is N/A with why.

A socket timeout alone bounds each ``recv``, not the whole answer: a server that sends one
byte a second (a slowloris, a wedged proxy) keeps every ``recv`` under any per-read timeout and
the read goes on forever. Here a watchdog timer shuts the socket down when the overall deadline
passes, which ends whatever read is blocked (status line, headers or body) at once, and the
body is read in chunks against a byte cap, so a huge answer is refused before it is held.

Plain ``http.client`` (stdlib) carries the request: the answers read here (dcgm-exporter's
``/metrics`` text, Prometheus's JSON API) need nothing a client library adds, and none of them
(urllib3, httpx, requests) bounds the whole answer by time either. Connections go straight to
the host named in the URL (no HTTP proxy): the endpoints are inside the cluster.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from gpudiag.probe.readings import Reading, Status, na, ok

_MIB = 1 << 20
CHUNK_BYTES = 64 * 1024
DEFAULT_MAX_BYTES = 32 * _MIB


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """What a server answered: the HTTP status, its content type and the body (bytes)."""

    url: str
    status: int
    reason: str
    content_type: str
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def _target(url: str, params: Mapping[str, str] | None) -> tuple[str, str, int, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path or "/"
    query = parts.query
    if params:
        extra = urllib.parse.urlencode(dict(params))
        query = f"{query}&{extra}" if query else extra
    return parts.scheme, parts.hostname, port, path + (f"?{query}" if query else "")


def http_get(
    url: str,
    *,
    params: Mapping[str, str] | None = None,
    timeout_s: float = 5.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
    accept: str = "*/*",
    source: str = "",
) -> Reading[HttpAnswer]:
    """GET ``url`` (with query ``params``) within ``timeout_s`` overall and ``max_bytes``.

    Any HTTP status is an OK reading (the caller knows what an error page means); N/A is for
    what kept an answer from arriving: refused, unreachable, the deadline, the size cap.
    """
    try:
        scheme, host, port, path = _target(url, params)
    except ValueError as exc:
        return na(Status.UNKNOWN, str(exc), source)
    conn_type = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = conn_type(host, port, timeout=timeout_s)
    expired = threading.Event()
    # The connected socket, kept here: http.client drops conn.sock once a response that
    # closes the connection has begun, but the response still reads from it.
    connected: list[socket.socket] = []

    def _expire() -> None:
        expired.set()
        for sock in connected:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(timeout_s, _expire)
    watchdog.daemon = True
    received = 0
    started = time.monotonic()

    def _late() -> Reading[HttpAnswer]:
        return na(
            Status.UNKNOWN,
            f"{url} did not answer in {timeout_s:g} s"
            + (f" (it had sent {received} bytes)" if received else ""),
            source,
        )

    watchdog.start()
    try:
        conn.connect()
        if conn.sock is not None:
            connected.append(conn.sock)
        if expired.is_set():
            return _late()
        conn.request("GET", path, headers={"Accept": accept, "Connection": "close"})
        response = conn.getresponse()
        chunks: list[bytes] = []
        while True:
            chunk = response.read(CHUNK_BYTES)
            if not chunk:
                break
            received += len(chunk)
            if received > max_bytes:
                return na(
                    Status.UNKNOWN,
                    f"{url} sent more than {max_bytes} bytes (read stopped there; a larger "
                    "answer needs max_bytes= raised)",
                    source,
                )
            chunks.append(chunk)
            if expired.is_set() or time.monotonic() - started > timeout_s:
                return _late()
        if expired.is_set():
            return _late()
        answer = HttpAnswer(
            url=url,
            status=int(response.status),
            reason=str(response.reason or ""),
            content_type=str(response.getheader("Content-Type", "") or ""),
            body=b"".join(chunks),
        )
        return ok(answer, source)
    except TimeoutError:
        return _late()
    except ConnectionRefusedError:
        return na(Status.NOT_FOUND, f"cannot reach {url} (connection refused)", source)
    except socket.gaierror as exc:
        return na(Status.NOT_FOUND, f"cannot reach {url} (unknown host: {exc})", source)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if expired.is_set():
            return _late()
        return na(Status.UNKNOWN, f"reading {url} failed: {type(exc).__name__}: {exc}", source)
    finally:
        watchdog.cancel()
        conn.close()


__all__ = ["DEFAULT_MAX_BYTES", "HttpAnswer", "http_get"]
