"""The reward client against misbehaving servers, and LocalServer's subprocess lifecycle."""

from __future__ import annotations

import contextlib
import http.server
import json
import signal
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rlsteps.engine.rewards.process import LocalServer, ServerStartError, free_port
from rlsteps.engine.rewards.rm.client import (
    INVALID_ANSWER_RETRIES,
    MAX_DELAY_S,
    RETRY_AFTER_JITTER_S,
    RewardClient,
    RewardError,
    RewardServerError,
    RewardServerUnavailable,
    _Retry,
)
from rlsteps.engine.rewards.rm.scorer import RewardScorer

Answer = tuple[int, str, dict[str, str]]  # status, body, headers


class StandIn:
    """A small HTTP server that plays a scripted list of answers (the last one repeats)."""

    def __init__(self, answers: list[Answer], delay_s: float = 0.0) -> None:
        self.answers, self.delay_s, self.hits = answers, delay_s, 0
        self.bodies: list[dict] = []
        self.in_flight = self.most_in_flight = 0  # requests being answered at once, now and at most
        lock = threading.Lock()
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                stand_in.bodies.append(json.loads(self.rfile.read(int(self.headers.get("content-length", 0)))))
                with lock:
                    status, body, headers = stand_in.answers[min(stand_in.hits, len(stand_in.answers) - 1)]
                    stand_in.hits += 1
                    stand_in.in_flight += 1
                    stand_in.most_in_flight = max(stand_in.most_in_flight, stand_in.in_flight)
                time.sleep(stand_in.delay_s)
                with lock:
                    stand_in.in_flight -= 1
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client timed out
                    self.send_response(status)
                    for key, value in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @contextlib.contextmanager
    def running(self) -> Iterator[StandIn]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


def ok(rewards: list[float]) -> Answer:
    return 200, json.dumps({"rewards": rewards}), {}


def test_closed_port_fails_fast_with_a_clear_message() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(RewardServerUnavailable) as caught:
        RewardClient(url, max_retries=2, backoff_s=0.01).score(["p"], ["r"])
    assert time.monotonic() - started < 3
    message = str(caught.value)
    assert url in message and "3 attempts" in message and "ConnectError" in message
    assert "rlsteps serve rm --model" in message and "rm.url" in message
    assert isinstance(caught.value, RewardError) and isinstance(caught.value, RuntimeError)


def test_slow_server_times_out_then_retries_then_fails() -> None:
    with StandIn([ok([1.0])], delay_s=1.0).running() as stand_in:
        with pytest.raises(RewardServerUnavailable, match="no answer within the timeout") as caught:
            RewardClient(stand_in.url, timeout_s=0.2, max_retries=2, backoff_s=0.01).score(["p"], ["r"])
    assert stand_in.hits == 3
    assert "3 attempts" in str(caught.value)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("<html>not json</html>", "not JSON"),
        ('{"scores": [1.0, 2.0]}', 'no "rewards" list'),
        ('{"rewards": [1.0]}', "1 rewards for 2 inputs"),
        ('{"rewards": [NaN, 1.0]}', "not finite numbers"),
        ('{"rewards": ["high", 1.0]}', "not finite numbers"),
        ('{"rewards": [true, 1.0]}', "not finite numbers"),
    ],
)
def test_invalid_answers_are_retried_a_little_then_raise(body: str, reason: str) -> None:
    with StandIn([(200, body, {})]).running() as stand_in:
        with pytest.raises(RewardServerError, match=reason):
            RewardClient(stand_in.url, max_retries=5, backoff_s=0.01).score(["p", "q"], ["r", "s"])
    assert stand_in.hits == 1 + INVALID_ANSWER_RETRIES


def test_5xx_is_retried_and_retry_after_is_honoured() -> None:
    answers = [(500, '{"detail": "boom"}', {}), (503, '{"detail": "full"}', {"Retry-After": "1"}), ok([0.5, -2])]
    with StandIn(answers).running() as stand_in:
        started = time.monotonic()
        rewards = RewardClient(stand_in.url, backoff_s=0.01).score(["p", "q"], ["r", "s"])
    assert rewards == [0.5, -2.0]
    assert stand_in.hits == 3
    assert time.monotonic() - started >= 1.0


def test_waits_follow_retry_after_with_jitter_else_an_exponential_backoff_all_capped() -> None:
    client = RewardClient("http://127.0.0.1:1", backoff_s=0.5)
    told = [client._delay_s(_Retry("busy", unavailable=True, wait_s=2), attempts=4) for _ in range(200)]
    assert 2.0 <= min(told) and max(told) <= 2.0 + RETRY_AFTER_JITTER_S  # never sooner than the server said
    assert max(told) - min(told) > 0.5 * RETRY_AFTER_JITTER_S  # spread, so refused clients do not come back together
    assert client._delay_s(_Retry("busy", unavailable=True, wait_s=600), attempts=1) == MAX_DELAY_S
    guessed = [client._delay_s(_Retry("down", unavailable=True), attempts=3) for _ in range(200)]
    assert 0.5 * 2 * 2 * 0.5 <= min(guessed) and max(guessed) <= 0.5 * 2 * 2 * 1.5  # backoff_s * 2^(attempts-1)
    assert client._delay_s(_Retry("down", unavailable=True), attempts=20) == MAX_DELAY_S


def test_requests_carry_the_truncation_options_and_conversations() -> None:
    conversation = [{"role": "user", "content": "hi"}]
    with StandIn([ok([1.0, 2.0]), ok([3.0])]).running() as stand_in:
        with RewardClient(stand_in.url, batch_size=2, concurrency=1, max_length=128, truncation_side="right") as c:
            assert c.score_conversations([conversation] * 3, ["a", "b", "c"]) == [1.0, 2.0, 3.0]
        with RewardClient(stand_in.url) as plain:
            plain.score_tokens([[1, 2]])
    options = {"max_length": 128, "truncation_side": "right"}
    assert stand_in.bodies[:2] == [
        {"conversations": [conversation] * 2, "responses": ["a", "b"], **options},
        {"conversations": [conversation], "responses": ["c"], **options},
    ]
    assert stand_in.bodies[2] == {"tokens": [[1, 2]]}  # none given: the server's own
    with pytest.raises(ValueError, match="truncation_side"):
        RewardClient(stand_in.url, truncation_side="middle")  # type: ignore[arg-type]


def test_4xx_is_not_retried() -> None:
    with StandIn([(401, '{"detail": "missing or wrong bearer token"}', {})]).running() as stand_in:
        with pytest.raises(RewardServerError, match="HTTP 401: missing or wrong bearer token.*check the token"):
            RewardClient(stand_in.url, token="nope", backoff_s=0.01).score(["p"], ["r"])
    assert stand_in.hits == 1


def test_batches_are_sent_concurrently_and_reassembled_in_order() -> None:
    # each answer takes 1 s: sent one after another, one request is in flight at a time; sent together, all four are
    # (counted by the server, not timed, so a loaded machine cannot fail it)
    with StandIn([ok([1.0, 2.0])], delay_s=1.0).running() as stand_in:
        rewards = RewardClient(stand_in.url, batch_size=2, concurrency=4).score(["p"] * 8, ["r"] * 8)
    assert rewards == [1.0, 2.0] * 4 and stand_in.hits == 4
    assert stand_in.most_in_flight == 4, f"{stand_in.most_in_flight} of 4 batches in flight at once: not concurrent"


def classified(*probs: list[float]) -> Answer:
    """vLLM's /classify answer, its classifications out of order."""
    data = [{"index": i, "label": "LABEL_0", "probs": p, "num_classes": len(p)} for i, p in enumerate(probs)]
    return 200, json.dumps({"object": "list", "data": data[::-1]}), {}


def test_vllm_and_triton_keep_the_retries_and_failure_rules_of_the_client() -> None:
    """Each server kind's answers go through the same rules: 5xx retried (Retry-After honoured), an answer without
    a reward per input retried a little then refused with its reason, other 4xx refused at once."""
    triton_ok = 200, json.dumps({"outputs": [{"name": "rewards", "datatype": "FP32", "shape": [2, 1], "data": [1, 2]}]})
    for api, good, wrong_count, score in (
        ("vllm", classified([1.5], [-2.0]), classified([1.5]), lambda c: c.score_tokens([[1], [2]])),
        ("triton", (*triton_ok, {}), (200, '{"outputs": []}', {}), lambda c: c.score_tokens([[1], [2, 3]])),
    ):
        answers = [(503, '{"error": "busy"}', {"Retry-After": "0"}), good]
        with StandIn(answers).running() as stand_in, RewardClient(stand_in.url, api=api, backoff_s=0.01) as client:
            assert score(client) == ([1.5, -2.0] if api == "vllm" else [1.0, 2.0]) and stand_in.hits == 2
        with StandIn([wrong_count]).running() as stand_in, RewardClient(stand_in.url, api=api, backoff_s=0.01) as c:
            with pytest.raises(RewardServerError, match="1 rewards for 2 inputs|no output named"):
                score(c)
        assert stand_in.hits == 1 + INVALID_ANSWER_RETRIES
        with StandIn([(400, '{"error": "bad input"}', {})]).running() as stand_in:
            with RewardClient(stand_in.url, api=api) as c, pytest.raises(RewardServerError, match="400: bad input"):
                score(c)
        assert stand_in.hits == 1


def test_a_vllm_model_of_several_labels_is_refused_as_no_scalar_reward_model() -> None:
    with StandIn([classified([0.1, 0.9])]).running() as stand_in:
        with RewardClient(stand_in.url, api="vllm", backoff_s=0.01) as client:
            with pytest.raises(RewardServerError, match=r"classifies into \[2\] labels.*num_labels=1"):
                client.score_tokens([[1, 2]])


def test_vllm_without_tokenizer_info_says_how_to_start_it_and_conversations_need_none() -> None:
    conversation = [{"role": "user", "content": "hi"}]
    with StandIn([classified([1.0])]).running() as stand_in:
        with RewardClient(stand_in.url, api="vllm", model="rm", max_retries=0) as client:
            with pytest.raises(RewardServerError, match="--enable-tokenizer-info-endpoint.*chat_template=reward_model"):
                client.score(["p"], ["r"])  # the stand-in answers no GET: a text's EOS is unknown
            assert client.score_conversations([conversation], ["r"]) == [1.0]
    assistant = {"role": "assistant", "content": "r"}
    assert stand_in.bodies == [{"messages": [*conversation, assistant], "model": "rm", "use_activation": False}]


def test_client_refuses_mismatched_inputs_and_urls_without_scheme() -> None:
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        RewardClient("http://127.0.0.1:1").score(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="http://rm-node:5555"):
        RewardClient("rm-node:5555")


# --- LocalServer --------------------------------------------------------------------------

HEALTH_SERVER = """
    import argparse, http.server
    parser = argparse.ArgumentParser()
    parser.add_argument("--host"); parser.add_argument("--port", type=int)
    args = parser.parse_args()
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b'{"status": "ok"}')
    print("serving", flush=True)
    http.server.HTTPServer((args.host, args.port), Health).serve_forever()
"""
HEALTHY_BUT_STUBBORN = """
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
""" + HEALTH_SERVER.lstrip("\n")


def write_module(folder: Path, name: str, source: str) -> dict[str, str]:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return {"PYTHONPATH": str(folder)}


def test_local_server_starts_answers_and_is_stopped(tmp_path: Path) -> None:
    env = write_module(tmp_path, "stubborn_server", HEALTHY_BUT_STUBBORN)
    server = LocalServer("stubborn_server", log_path=tmp_path / "logs" / "server.log", env=env, stop_grace_s=0.5)
    with server:
        process = server.process
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        assert server.url.startswith("http://127.0.0.1:")
    assert process is not None and process.returncode == -signal.SIGKILL  # it ignored SIGTERM
    assert "serving" in (tmp_path / "logs" / "server.log").read_text()
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.url


def test_local_server_that_crashes_reports_its_log_tail(tmp_path: Path) -> None:
    crash = 'print("loading weights"); raise SystemExit("no weights in /nowhere")'
    env = write_module(tmp_path, "crashing_server", crash)
    with pytest.raises(ServerStartError, match=r"exited with code 1(.|\n)*no weights in /nowhere"):
        with LocalServer("crashing_server", log_path=tmp_path / "server.log", env=env):
            pass


def test_local_server_that_never_comes_up_times_out_and_is_killed(tmp_path: Path) -> None:
    env = write_module(tmp_path, "silent_server", 'import time; print("still loading", flush=True); time.sleep(60)')
    server = LocalServer("silent_server", log_path=tmp_path / "server.log", env=env, startup_timeout_s=1)
    started = time.monotonic()
    with pytest.raises(ServerStartError, match=r"did not answer(.|\n)*still loading"):
        server.start()
    assert server.process is None and time.monotonic() - started < 10


def test_local_server_is_stopped_when_the_block_is_interrupted(tmp_path: Path) -> None:
    env = write_module(tmp_path, "stubborn_server", HEALTHY_BUT_STUBBORN)
    with pytest.raises(KeyboardInterrupt):
        with LocalServer("stubborn_server", log_path=tmp_path / "server.log", env=env, stop_grace_s=0.2) as server:
            process = server.process
            raise KeyboardInterrupt
    assert process is not None and process.poll() is not None


def test_local_reward_server_end_to_end(tmp_path: Path) -> None:
    from model_fixtures import PROMPTS, RESPONSES, save_reward_model

    model = save_reward_model(tmp_path / "rm")
    args = ["--model", str(model), "--device", "cpu", "--max-wait-ms", "1", "--token-env", "RM_TEST_TOKEN"]
    env = {"RM_TEST_TOKEN": "t0ken", "OMP_NUM_THREADS": "1"}
    with LocalServer("rlsteps.engine.rewards.rm", args, log_path=tmp_path / "rm.log", env=env) as server:
        assert "t0ken" not in " ".join(server.command)
        with RewardClient(server.url, token="t0ken") as client:
            rewards = client.score(PROMPTS, RESPONSES)
            health = client.health()
        process = server.process
    assert rewards == pytest.approx(RewardScorer(model).score(PROMPTS, RESPONSES), abs=1e-5)
    assert health["model"] == str(model) and health["requests"] == 1
    assert process is not None and process.poll() is not None
    with pytest.raises(RewardServerUnavailable):
        RewardClient(f"http://127.0.0.1:{server.port}", max_retries=0).score(["p"], ["r"])
