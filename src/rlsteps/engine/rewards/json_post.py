"""Many small JSON POSTs to one URL from several threads, over kept-alive connections.

A judge step sends one chat completion per comparison (64 for a tiny step), so a client's own cost per request
is a large share of the step: httpx spends about 0.5 ms of CPU more per request than the standard library's
http.client, and with the judge's server on the same two cores that was half of a step's judging (0.09 s
against 0.045 s, benchmarks/README.md). `json_poster` gives the pooled http.client poster, or an httpx one where
a proxy applies to the URL (httpx honours HTTP(S)_PROXY and NO_PROXY; the pool connects directly).
"""

from __future__ import annotations

import http.client
import json
import queue
import ssl
import urllib.request
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx

# A kept-alive connection the server closed fails its next request at once with one of these
STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class TransportError(Exception):
    """The request got no HTTP answer: refused, reset, timed out, or an unreadable reply."""


@dataclass(frozen=True)
class Reply:
    status: int
    text: str

    def json(self) -> object:
        return json.loads(self.text)


class JSONPoster(Protocol):
    def post(self, body: dict, timeout_s: float | None = None) -> Reply: ...

    def close(self) -> None: ...


def json_poster(url: str, headers: dict[str, str], timeout_s: float, max_connections: int) -> JSONPoster:
    """The poster for `url`: connections of our own, or httpx where the environment sets a proxy for it."""
    parts = urlsplit(url)
    if parts.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(parts.hostname or ""):
        return HttpxPoster(url, headers, timeout_s, max_connections)
    return PooledPoster(url, headers, timeout_s, max_connections)


class PooledPoster:
    """http.client connections to one http(s) URL, at most `max_connections` kept alive between requests.

    A connection is taken from the pool for one request and put back after its reply is read; a connection the
    server closed while it waited in the pool is replaced once, at once (that is no failed attempt)."""

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float, max_connections: int) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", **headers}
        self.timeout_s = timeout_s
        self.idle: queue.LifoQueue[http.client.HTTPConnection] = queue.LifoQueue(maxsize=max(1, max_connections))
        self.context = ssl.create_default_context() if self.scheme == "https" else None

    def post(self, body: dict, timeout_s: float | None = None) -> Reply:
        """One request; timeout_s (at most the poster's own) bounds its connect and each read, where the caller's
        patience ends sooner."""
        payload = json.dumps(body).encode()
        connection, reused = self._take()
        while True:
            try:
                _bound(connection, min(self.timeout_s, timeout_s or self.timeout_s))
                reply = self._exchange(connection, payload)
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                if reused and isinstance(error, STALE):  # closed by the server while it was idle in the pool
                    connection, reused = self._connect(), False
                    continue
                raise TransportError(f"{type(error).__name__}: {error}") from None
            self._give_back(connection)
            return reply

    def close(self) -> None:
        while True:
            try:
                self.idle.get_nowait().close()
            except queue.Empty:
                return

    def _connect(self) -> http.client.HTTPConnection:
        if self.context is not None:
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s, context=self.context)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection (True) or a new one (False)."""
        try:
            return self.idle.get_nowait(), True
        except queue.Empty:
            return self._connect(), False

    def _give_back(self, connection: http.client.HTTPConnection) -> None:
        try:
            self.idle.put_nowait(connection)
        except queue.Full:
            connection.close()

    def _exchange(self, connection: http.client.HTTPConnection, payload: bytes) -> Reply:
        connection.request("POST", self.path, body=payload, headers=self.headers)
        response = connection.getresponse()
        text = response.read().decode("utf-8", errors="replace")
        if response.will_close:
            connection.close()  # http.client reconnects it at its next request
        return Reply(response.status, text)


def _bound(connection: http.client.HTTPConnection, timeout_s: float) -> None:
    """The connection's timeout for its next request: a new connection connects with it, an open one reads with it."""
    connection.timeout = timeout_s
    if connection.sock is not None:
        connection.sock.settimeout(timeout_s)


class HttpxPoster:
    """The same through httpx, which goes through the proxy the environment sets."""

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float, max_connections: int) -> None:
        self.url = url
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.client = httpx.Client(headers=headers, timeout=timeout_s, limits=limits)

    def post(self, body: dict, timeout_s: float | None = None) -> Reply:
        try:
            response = self.client.post(self.url, json=body, timeout=timeout_s or httpx.USE_CLIENT_DEFAULT)
        except httpx.HTTPError as error:
            raise TransportError(f"{type(error).__name__}: {error}") from None
        return Reply(response.status_code, response.text)

    def close(self) -> None:
        self.client.close()
