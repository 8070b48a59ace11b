"""A wait on a server is never silent: the reward-model client, the judge client and a server the run starts each say,
at least every HEARTBEAT_S while they wait, what they wait for, the attempt and the time left before they give up.

The server that does not answer is real: a socket on loopback that listens and never reads, as a server stopped
with SIGSTOP (the kernel accepts the connection; no answer ever comes).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from rlsteps.engine.rewards import waiting
from rlsteps.engine.rewards.judge.client import JudgeClient, JudgeUnavailable
from rlsteps.engine.rewards.process import LocalServer, ServerStartError
from rlsteps.engine.rewards.rm.client import RewardClient, RewardServerUnavailable
from test_reward_client import HEALTH_SERVER, write_module

BEAT_S = 0.25  # the heartbeat in these tests (30 s in a run)
SLACK_S = 1.0  # a thread's lateness on a loaded machine
LINE = re.compile(
    r"still waiting for (?P<what>.+): attempt (?P<attempt>\d+)(?: of (?P<of>\d+))?, \d+s so far, "
    r"(gives up in (?P<left>[1-9]\d*)s at most|giving up now)"
)  # fmt: skip: never "in 0s"


@pytest.fixture
def stalled() -> Iterator[str]:
    """The URL of a server that accepts connections and never answers."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(64)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"


@pytest.fixture
def heard(monkeypatch, caplog) -> list[tuple[float, str]]:
    """(when, line) of every heartbeat, at BEAT_S."""
    monkeypatch.setattr(waiting, "HEARTBEAT_S", BEAT_S)
    lines: list[tuple[float, str]] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append((time.monotonic(), record.getMessage()))
    logging.getLogger(waiting.__name__).addHandler(handler)
    yield lines
    logging.getLogger(waiting.__name__).removeHandler(handler)


def assert_never_silent(lines: list[tuple[float, str]], started: float, ended: float, what: str) -> list[dict]:
    """Each line matches LINE and names `what`; no gap without one is much longer than BEAT_S."""
    assert lines, "no line while waiting"
    times = [started, *(when for when, _ in lines)]
    assert max(b - a for a, b in zip(times, times[1:])) < BEAT_S + SLACK_S, lines
    assert ended - times[-1] < BEAT_S + SLACK_S, (ended - times[-1], lines)
    found = [LINE.fullmatch(line) for _, line in lines]
    assert all(found) and {m["what"] for m in found} == {what}, lines
    return [m.groupdict() for m in found]


def test_the_reward_client_says_what_it_waits_for_the_attempt_and_the_time_left(stalled, heard):
    client = RewardClient(stalled, timeout_s=1, max_retries=1, backoff_s=0.1, unavailable_fix="check it")
    started = time.monotonic()
    with client, pytest.raises(RewardServerUnavailable) as gave_up:
        client.score(["p"], ["r"])
    ended = time.monotonic()
    said = assert_never_silent(heard, started, ended, f"the reward server at {stalled}")
    assert [s["attempt"] for s in said][0] == "1" and said[-1]["attempt"] == "2" and said[0]["of"] == "2"
    assert ended - started <= client.patience_s()  # it gave up within what it said
    lefts = [int(s["left"]) for s in said]
    assert lefts == sorted(lefts, reverse=True) and lefts[0] <= client.patience_s()
    assert str(gave_up.value).endswith("; check it")  # the fix the run gave it for this case


def test_a_quick_answer_is_waited_for_in_silence(heard):
    with waiting.Waiting("a server", patience_s=10):
        time.sleep(BEAT_S / 5)
    time.sleep(BEAT_S * 2)
    assert heard == []


def test_the_judge_client_says_what_it_waits_for(stalled, heard):
    client = JudgeClient(f"{stalled}/v1", "judge", timeout_s=1, max_retries=1, retry_sleep_s=0.1, unavailable_fix="fix")
    started = time.monotonic()
    # one pair, shown both ways round (judge.both_orders): two comparisons
    with client, pytest.raises(JudgeUnavailable, match="failed all 2 comparisons after 2 attempts each .*; fix$"):
        client.judge([([{"role": "user", "content": "q"}], ["a", "b"])])
    said = assert_never_silent(heard, started, time.monotonic(), f"the judge at {stalled}/v1/chat/completions")
    assert said[-1]["attempt"] == "2" and said[-1]["of"] == "2"


def test_the_judges_patience_bounds_a_whole_steps_comparisons_not_each_one(stalled, heard):
    """A step of 12 groups (96 comparisons, 4 in flight) to a judge that never answers: the stated patience is the
    whole wait, within 10% (it was 24 times the patience: every burst of 4 waited the whole patience again), and no
    heartbeat reads 0s."""
    client = JudgeClient(f"{stalled}/v1", "judge", timeout_s=1, max_retries=2, retry_sleep_s=0.1, unavailable_fix="f")
    groups = [([{"role": "user", "content": f"q{g}"}], ["a", "b", "c", "d"]) for g in range(12)]
    patience = client.patience_s()  # as the run states it where it starts (the /v1/models question included)
    started = time.monotonic()
    with client, pytest.raises(JudgeUnavailable, match="failed all 96 comparisons"):
        client.judge(groups)
    waited = time.monotonic() - started
    assert patience * 0.9 <= waited <= patience * 1.1, (waited, patience)
    assert_never_silent(heard, started, time.monotonic(), f"the judge at {stalled}/v1/chat/completions")
    assert "all of a step's comparisons together" in client.patience()


def test_a_server_the_run_starts_is_waited_for_aloud_with_its_log(tmp_path, heard):
    env = write_module(tmp_path, "loading_server", 'import time; print("loading", flush=True); time.sleep(60)')
    server = LocalServer("loading_server", log_path=tmp_path / "server.log", env=env, startup_timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(ServerStartError, match="within 2s, the time a run gives a server it starts to load"):
        server.start()
    what = f"the loading_server server this run started to answer {{url}}/health (log: {tmp_path / 'server.log'})"
    url = re.search(r"to answer (http://\S+)/health", heard[0][1])[1]
    said = assert_never_silent(heard, started, time.monotonic(), what.format(url=url))
    assert said[0]["of"] is None and int(said[-1]["attempt"]) > int(said[0]["attempt"])  # polls, counted


def test_a_stopped_server_is_ended_at_once_not_after_the_grace_period(tmp_path):
    """A server stopped with SIGSTOP (the stall users try) handles its SIGTERM only once it is continued."""
    env = write_module(tmp_path, "serving_server", HEALTH_SERVER)
    with LocalServer("serving_server", log_path=tmp_path / "server.log", env=env, stop_grace_s=60) as server:
        process = server.process
        os.kill(process.pid, signal.SIGSTOP)
        started = time.monotonic()
    assert process.returncode == -signal.SIGTERM and time.monotonic() - started < 10
