"""A local reward server loads while the worker goes on: started without waiting, waited for at its first use."""

import threading
import time
from pathlib import Path

import pytest

from rlsteps.engine.rewards.process import LocalServer, ServerStartError
from rlsteps.engine.rewards.sources import RewardModelSource
from rlsteps.engine.run.step import is_reward_failure
from test_reward_client import write_module

GATED = """
    import argparse, http.server, os, time
    parser = argparse.ArgumentParser()
    parser.add_argument("--host"); parser.add_argument("--port", type=int); parser.add_argument("--gate")
    args = parser.parse_args()
    while not os.path.exists(args.gate):  # "loading" until the test opens the gate
        time.sleep(0.05)
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b'{"status": "ok"}')
    http.server.HTTPServer((args.host, args.port), Health).serve_forever()
"""


def test_a_server_started_without_waiting_is_waited_for_once_at_its_first_use(tmp_path: Path) -> None:
    env = write_module(tmp_path, "gated_server", GATED)
    gate = tmp_path / "gate"
    server = LocalServer("gated_server", ["--gate", str(gate)], log_path=tmp_path / "server.log", env=env)
    try:
        server.start(wait=False)  # returns while the server is still "loading"
        assert server.process is not None and server.process.poll() is None and not server.ready
        waited = threading.Thread(target=server.wait_until_ready)
        waited.start()
        time.sleep(0.5)
        assert waited.is_alive() and not server.ready  # still waiting: the gate is shut
        gate.touch()
        waited.join(timeout=30)
        assert not waited.is_alive() and server.ready
        started = time.monotonic()
        server.wait_until_ready()  # a second call returns at once
        assert time.monotonic() - started < 0.1
    finally:
        server.stop()


def test_a_source_waits_for_its_server_before_it_scores() -> None:
    calls = []

    class Client:
        def score(self, prompts, responses):
            calls.append("score")
            return [1.0] * len(prompts)

    class Batch:
        prompt_texts, response_texts = ["p"], ["r"]

        def __len__(self):
            return 1

    source = RewardModelSource(Client(), ready=lambda: calls.append("ready"))
    assert source.score(Batch()).rewards.tolist() == [1.0] and calls == ["ready", "score"]


def test_a_server_that_never_came_up_stops_the_run_as_missing_rewards_do(tmp_path: Path) -> None:
    env = write_module(tmp_path, "crashing_server", 'raise SystemExit("no weights in /nowhere")')
    server = LocalServer("crashing_server", log_path=tmp_path / "server.log", env=env)
    server.start(wait=False)
    with pytest.raises(ServerStartError, match="no weights in /nowhere") as failed:
        server.wait_until_ready()
    assert server.process is None and is_reward_failure(failed.value)  # the loop stops with a line, not a traceback
