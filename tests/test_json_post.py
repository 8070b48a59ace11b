"""The judge client's transport: pooled keep-alive connections against a real HTTP server on loopback."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlsteps.engine.rewards.json_post import HttpxPoster, PooledPoster, TransportError, json_poster


class Echo(BaseHTTPRequestHandler):
    """Answers a POST with its JSON body and the client's port; `drop` closes each connection after its answer
    without saying so (as a server whose keep-alive ran out), `delay_s` answers late."""

    protocol_version = "HTTP/1.1"
    drop = False
    delay_s = 0.0

    def do_POST(self):  # noqa: N802 - the http.server protocol
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(self.delay_s)
        self.server.ports.append(self.client_address[1])
        data = json.dumps({"echo": body, "auth": self.headers.get("Authorization")}).encode()
        self.send_response(404 if body.get("missing") else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if self.drop:
            self.close_connection = True

    def log_message(self, *args):
        pass


class EchoServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exception(), ConnectionError):  # a client that gave up by design has gone: quiet
            super().handle_error(request, client_address)


@pytest.fixture
def server(request):
    handler = type("Handler", (Echo,), dict(getattr(request, "param", {})))
    httpd = EchoServer(("127.0.0.1", 0), handler)
    httpd.ports = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def url_of(httpd) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}/v1/chat/completions"


def test_sequential_requests_reuse_one_connection_and_carry_the_headers(server):
    poster = PooledPoster(url_of(server), {"Authorization": "Bearer sk-1"}, timeout_s=5, max_connections=4)
    replies = [poster.post({"n": n}) for n in range(5)]
    assert [r.json()["echo"] for r in replies] == [{"n": n} for n in range(5)]
    assert {r.status for r in replies} == {200} and replies[0].json()["auth"] == "Bearer sk-1"
    assert len(set(server.ports)) == 1
    poster.close()


def test_concurrent_requests_keep_at_most_max_connections_alive(server):
    poster = PooledPoster(url_of(server), {}, timeout_s=5, max_connections=3)
    for _ in range(3):
        with ThreadPoolExecutor(8) as pool:
            assert [r.json()["echo"]["n"] for r in pool.map(lambda n: poster.post({"n": n}), range(24))] == list(
                range(24)
            )
    assert poster.idle.qsize() <= 3
    assert len(set(server.ports)) < 24 * 3  # kept alive: far fewer connections than requests


@pytest.mark.parametrize("server", [{"drop": True}], indirect=True)
def test_a_connection_the_server_closed_while_idle_is_replaced_without_a_failure(server):
    poster = PooledPoster(url_of(server), {}, timeout_s=5, max_connections=2)
    for n in range(4):
        assert poster.post({"n": n}).json()["echo"] == {"n": n}
    assert len(set(server.ports)) == 4  # a new connection each time, and no request lost


def test_an_http_error_status_is_a_reply_not_an_exception(server):
    reply = PooledPoster(url_of(server), {}, timeout_s=5, max_connections=1).post({"missing": True})
    assert reply.status == 404 and reply.json()["echo"] == {"missing": True}


def test_a_refused_connection_is_a_transport_error_naming_the_cause():
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(TransportError, match="ConnectionRefusedError"):
        PooledPoster(f"http://127.0.0.1:{port}/v1", {}, timeout_s=5, max_connections=1).post({})


@pytest.mark.parametrize("server", [{"delay_s": 1.0}], indirect=True)
def test_an_answer_later_than_the_timeout_is_a_transport_error(server):
    started = time.perf_counter()
    with pytest.raises(TransportError, match="timed out"):
        PooledPoster(url_of(server), {}, timeout_s=0.2, max_connections=1).post({})
    assert time.perf_counter() - started < 0.9


def test_a_url_behind_a_proxy_goes_through_httpx_which_honours_it(monkeypatch):
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(json_poster("http://judge.example:8000/v1", {}, 5, 2), PooledPoster)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    assert isinstance(json_poster("http://judge.example:8000/v1", {}, 5, 2), HttpxPoster)
    assert isinstance(json_poster("https://judge.example/v1", {}, 5, 2), PooledPoster)  # no https proxy set
    monkeypatch.setenv("NO_PROXY", "judge.example")
    assert isinstance(json_poster("http://judge.example:8000/v1", {}, 5, 2), PooledPoster)


def test_a_url_that_is_not_http_is_refused():
    with pytest.raises(ValueError, match="not an http"):
        PooledPoster("ftp://host/v1", {}, 5, 1)
