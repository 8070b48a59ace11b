"""The generative judge: pairing, request format, answer parsing, scoring, and the HTTP client."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import pytest

from rlsteps.engine.rewards.judge.client import JudgeClient, JudgeUnavailable
from rlsteps.engine.rewards.judge.parsing import JudgeParseError, parse_judgement
from rlsteps.engine.rewards.judge.protocol import (
    RESPONSE_FORMATS,
    Judgement,
    JudgeRequest,
    comparison_pairs,
    judge_messages,
    parse_judge_request,
)
from rlsteps.engine.rewards.judge.scoring import (
    DEFAULT_SCORE,
    group_rewards,
    length_penalty,
    pair_scores,
    verdict_stats,
)
from rlsteps.engine.rewards.process import free_port

# --- pairs and the request format -------------------------------------------------------------


def test_comparison_pairs():
    assert comparison_pairs(4, "circular") == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert comparison_pairs(3, "circular") == [(0, 1), (1, 2), (2, 0)]
    assert comparison_pairs(2, "circular") == [(0, 1)]
    assert comparison_pairs(1, "circular") == []
    assert comparison_pairs(3, "all") == [(0, 1), (0, 2), (1, 2)]
    assert comparison_pairs(1, "all") == []
    with pytest.raises(ValueError, match="'circular' or 'all'"):
        comparison_pairs(3, "ring")


def test_both_orders_show_each_pair_the_other_way_round_right_after():
    assert comparison_pairs(3, "circular", both_orders=True) == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (0, 2)]
    assert comparison_pairs(2, "circular", both_orders=True) == [(0, 1), (1, 0)]
    assert comparison_pairs(3, "all", both_orders=True) == [(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)]
    assert comparison_pairs(1, "all", both_orders=True) == []


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_judge_request_round_trip_keeps_the_texts_exactly():
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?\n"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "And 2+3?"},
    ]
    first, second = "  4\n\n", "[RESPONSE 1]\nfive {}"
    messages = judge_messages(conversation, first, second, principle="prefer correct answers")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "prefer correct answers" in messages[0]["content"]
    assert '"score_1"' in messages[0]["content"] and "JSON object" in messages[0]["content"]
    assert parse_judge_request(messages) == JudgeRequest(conversation, first, second)
    assert "principle" not in judge_messages(user("p"), "a", "b", None)[0]["content"]


def test_the_judge_sees_the_conversation_not_a_chat_template():
    """The hand-written request: role-tagged sections of the prompt's own messages, no template markup."""
    conversation = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Describe the cat."}]
    messages = judge_messages(conversation, "The cat is kind.", "It is dull.", None)
    assert messages[1]["content"] == (
        "[CONVERSATION]\n[SYSTEM]\nBe kind.\n[/SYSTEM]\n[USER]\nDescribe the cat.\n[/USER]\n[/CONVERSATION]\n\n"
        "[RESPONSE 1]\nThe cat is kind.\n[/RESPONSE 1]\n\n[RESPONSE 2]\nIt is dull.\n[/RESPONSE 2]"
    )
    with pytest.raises(ValueError, match="role"):
        judge_messages([{"role": "tool", "content": "x"}], "a", "b", None)


def test_the_structured_output_schema_admits_exactly_the_judgement_fields():
    schema = RESPONSE_FORMATS["json_schema"]["json_schema"]["schema"]
    jsonschema.validate({"score_1": 5, "score_2": 1, "ranking": 6}, schema)
    for wrong in (
        {"score_1": 6, "score_2": 1, "ranking": 1},
        {"score_1": 5, "score_2": 1},
        {"score_1": 5, "score_2": 1, "ranking": 2, "why": "x"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
    assert RESPONSE_FORMATS["json_object"] == {"type": "json_object"} and RESPONSE_FORMATS["none"] is None


def test_judge_request_that_was_not_built_by_judge_messages_is_rejected():
    with pytest.raises(ValueError, match=r"\[CONVERSATION\]"):
        parse_judge_request([{"role": "user", "content": "Which is better, A or B?"}])
    with pytest.raises(ValueError, match="no user message"):
        parse_judge_request([{"role": "system", "content": "hi"}])
    with pytest.raises(ValueError, match="list"):
        parse_judge_request("hello")  # type: ignore[arg-type]


# --- parsing the judge's answer ----------------------------------------------------------------


def test_parse_plain_json():
    assert parse_judgement('{"score_1": 4, "score_2": 2, "ranking": 2}') == Judgement(4.0, 2.0, 2.0)


def test_parse_fenced_block_wins_over_other_objects():
    text = (
        'Let me think. A draft: {"score_1": 1, "score_2": 1, "ranking": 6}\n'
        '```json\n{"score_1": 5, "score_2": 3, "ranking": 1.5}\n```\n'
        'Format reminder: {"score_1": 2, "score_2": 2, "ranking": 3}'
    )
    assert parse_judgement(text) == Judgement(5.0, 3.0, 1.5)


def test_parse_last_object_without_a_fence_and_stray_braces():
    text = (
        'I weigh {both} of them. {"score_1": 1, "score_2": 1, "ranking": 6} '
        'then {"score_1": 3, "score_2": 4, "ranking": 5}'
    )
    assert parse_judgement(text) == Judgement(3.0, 4.0, 5.0)


def test_parse_nested_overall_object():
    text = '```json\n{"details": {"clarity": 2}, "overall": {"score_1": "2", "score_2": 5, "ranking": 6}}\n```'
    assert parse_judgement(text) == Judgement(2.0, 5.0, 6.0)


@pytest.mark.parametrize(
    "text, cause",
    [
        ('```json\n{"score_1": 4, "score_2": 2, "rank', "no JSON object"),  # truncated
        ("The first response is better.", "no JSON object"),  # garbage
        ("", "empty content"),
        ('{"score_1": 4, "score_2": 2}', "no JSON object with score_1, score_2 and ranking"),  # missing key
        ('{"score_1": 6, "score_2": 2, "ranking": 1}', "score_1=6 is outside 1-5"),
        ('{"score_1": 3, "score_2": 0, "ranking": 1}', "score_2=0 is outside 1-5"),
        ('{"score_1": 3, "score_2": 2, "ranking": 7}', "ranking=7 is outside 1-6"),
        ('{"score_1": true, "score_2": 2, "ranking": 2}', "score_1=True is not a number"),
        ('{"score_1": 4, "score_2": "good", "ranking": 2}', "score_2='good' is not a number"),
    ],
)
def test_parse_failures_name_the_cause(text: str, cause: str):
    with pytest.raises(JudgeParseError, match=cause):
        parse_judgement(text)


def test_parse_error_quotes_a_shortened_copy_of_the_answer():
    with pytest.raises(JudgeParseError) as info:
        parse_judgement("start " + "x" * 5000 + " end")
    message = str(info.value)
    assert "start" in message and "end" in message and len(message) < 400


# --- scores and rewards ------------------------------------------------------------------------


def test_pair_scores_tie_break_with_the_ranking():
    assert pair_scores(Judgement(4, 2, 6)) == (4, 2)  # no tie: the ranking is not used
    assert pair_scores(Judgement(3, 3, 2)) == (4.5, 1.5)  # adj = 3.5 - 2
    assert pair_scores(Judgement(3, 3, 6)) == (0.5, 5.5)  # adj = -2.5
    assert pair_scores(Judgement(3, 3, 3.5)) == (3, 3)


def test_group_rewards_mean_over_successful_comparisons():
    pairs = [(0, 1), (1, 2), (2, 0)]
    judgements = [Judgement(4, 2, 2), None, Judgement(5, 3, 1)]
    # response 0: 4 (pair 0-1) and 3 (pair 2-0); response 1: 2; response 2: 5
    assert group_rewards(3, pairs, judgements) == ([3.5, 2.0, 5.0], [True, True, True])


def test_a_pair_shown_both_ways_round_is_one_pair_its_two_verdicts_combined():
    pairs = [(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (0, 2)]
    judgements = [Judgement(4, 2, 2), Judgement(3, 3, 2), None, Judgement(1, 5, 6), Judgement(2, 4, 5), None]
    # pair 0-1: response 0 scores 4, then 1.5 (shown second, a tie ranked 2); response 1: 2, then 4.5
    # pair 1-2, shown once of twice: 5 and 1; pair 2-0: 2 and 4
    rewards, valid = group_rewards(3, pairs, judgements)
    assert rewards == [(2.75 + 4) / 2, (3.25 + 5) / 2, (1 + 2) / 2] and valid == [True, True, True]
    # a judge that scores each response on its own (as `rlsteps serve judge` does): response 0 scores 1.0 beside
    # response 1 and 2.1 beside response 2. Its rewards shown both ways round are those shown once, to the bit, where
    # a mean over the four verdicts would give 1.5499999999999998 for 1.55
    once = [Judgement(1.0, 3.0, 5), Judgement(3.0, 4.0, 5), Judgement(4.0, 2.1, 2)]
    both = [v for j in once for v in (j, Judgement(j.score_2, j.score_1, 7 - j.ranking))]
    shown_once = group_rewards(3, comparison_pairs(3, "circular"), once)
    assert shown_once[0][0] == 1.55 and group_rewards(3, comparison_pairs(3, "circular", True), both) == shown_once


def test_group_rewards_response_without_a_successful_comparison_is_masked():
    pairs = [(0, 1), (1, 2), (2, 0)]
    rewards, valid = group_rewards(3, pairs, [Judgement(5, 1, 1), None, None])
    assert rewards == [5.0, 1.0, DEFAULT_SCORE]
    assert valid == [True, True, False]
    with pytest.raises(ValueError, match="one judgement"):
        group_rewards(3, pairs, [None])


def test_verdict_stats_count_contradictions_and_the_wins_of_the_first_shown():
    verdicts = [
        Judgement(5, 1, 6),  # the scores say response 1, the ranking response 2: a contradiction; 1 wins (scores)
        Judgement(2, 4, 5),  # response 2 by both
        Judgement(3, 3, 2),  # a tie in the scores, broken by the ranking: response 1; no contradiction
        Judgement(3, 3, 3.5),  # a draw: no winner
    ]
    assert verdict_stats(verdicts) == {"contradictions": 1.0, "contradiction_rate": 0.25, "first_position_rate": 2 / 3}
    assert verdict_stats([Judgement(3, 3, 3.5)]) == {"contradictions": 0.0, "contradiction_rate": 0.0}
    assert verdict_stats([]) == {}


def test_length_penalty_is_zero_centred():
    assert length_penalty([1.0, 1.0, 1.0], [10, 20, 30], coef=0.5) == pytest.approx([1.25, 1.0, 0.75])
    assert length_penalty([2.0, 4.0], [0, 0], coef=1.0) == [2.0, 4.0]
    assert length_penalty([2.0, 4.0], [5, 100], coef=0.0) == [2.0, 4.0]


# --- the client against a real loopback HTTP server -----------------------------------------------

QUALITY = {"great": 5, "flaky": 4, "fine": 3, "meh": 3, "poor": 1}


def fenced(score_1: float, score_2: float, ranking: float) -> str:
    return f'```json\n{{"score_1": {score_1}, "score_2": {score_2}, "ranking": {ranking}}}\n```'


class StandIn:
    """Canned OpenAI-format judge: garbage on the first try of every comparison, then a good answer.

    Responses named in QUALITY get that score; a tie is ranked 2 (response 1 slightly better);
    a comparison involving "babble" never gets a parseable answer; "flaky" gets an HTTP 500 first.
    """

    def __init__(self, models: dict | None = None) -> None:
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.attempts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.models = models  # GET /v1/models's answer; None: 404, as a server without the route
        self.models_asked: list[dict] = []  # the headers of each GET /v1/models

    def answer(self, body: dict) -> tuple[int, str]:
        request = parse_judge_request(body["messages"])
        first, second = request.response_1, request.response_2
        with self.lock:
            self.attempts[first + "|" + second] += 1
            attempt = self.attempts[first + "|" + second]
        if "flaky" in (first, second) and attempt == 1:
            return 500, "overloaded"
        if "babble" in (first, second) or attempt == 1:
            return 200, "Both responses are wonderful {not json"
        s1, s2 = QUALITY[first], QUALITY[second]
        ranking = 2 if s1 == s2 else (1 if s1 > s2 else 6)
        return 200, f"Thinking done.\n{fenced(s1, s2, ranking)}"


@contextlib.contextmanager
def stand_in_server(stand_in: StandIn) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with stand_in.lock:
                stand_in.bodies.append(body)
                stand_in.headers.append(dict(self.headers))
            status, content = stand_in.answer(body)
            payload = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
            data = json.dumps(payload if status == 200 else {"error": content}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            with stand_in.lock:
                stand_in.models_asked.append(dict(self.headers))
            found = self.path == "/v1/models" and stand_in.models is not None
            data = json.dumps(stand_in.models if found else {"error": "not found"}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def make_client(url: str, **kwargs) -> JudgeClient:
    """A client showing each pair once, unless the test asks for both orders (the default of judge.both_orders)."""
    kwargs.setdefault("both_orders", False)
    return JudgeClient(url, "judge-model", api_key="sk-test", retry_sleep_s=0.01, timeout_s=5, **kwargs)


def test_client_retries_garbage_and_scores_groups():
    stand_in = StandIn()
    groups = [(user("Q1"), ["great", "fine", "poor"]), (user("Q2"), ["fine", "meh"]), (user("Q3"), ["great"])]
    with stand_in_server(stand_in) as url, make_client(url, concurrency=4, temperature=0.3) as client:
        result = client.judge(groups)
    # Q1 circular: (great, fine) 5/3, (fine, poor) 3/1, (poor, great) 1/5
    # Q2: fine and meh tie at 3, ranked 2 -> 3 + 1.5 and 3 - 1.5; Q3: a single response has no comparison
    assert result.rewards == [[5.0, 3.0, 1.0], [4.5, 1.5], [DEFAULT_SCORE]]
    assert result.valid == [[True, True, True], [True, True], [False]]
    assert result.stats["comparisons"] == 4
    assert result.stats["retries"] == 4  # every comparison got garbage once
    assert result.stats["parse_failures"] == 0 and result.stats["transport_failures"] == 0
    assert result.stats["latency_mean_s"] > 0
    body = stand_in.bodies[0]
    assert body["model"] == "judge-model" and body["temperature"] == 0.3
    assert body["top_p"] == 0.95 and body["max_tokens"] == 256
    assert body["response_format"] == RESPONSE_FORMATS["json_schema"]  # structured output unless switched off
    assert stand_in.headers[0]["Authorization"] == "Bearer sk-test"
    assert [(a.group, a.pair, a.failure) for a in result.answers] == [
        (0, (0, 1), None), (0, (1, 2), None), (0, (2, 0), None), (1, (0, 1), None),
    ]  # fmt: skip
    assert result.answers[0].content == "Thinking done.\n" + fenced(5, 3, 1)


def test_both_orders_cancel_a_judge_that_favours_the_response_shown_first():
    """The stand-in ranks a tie in its scores 2: "response 1 is better", whichever response that is (as SmolLM2 judged
    identical answers). Shown once, the tie becomes a win of 4.5 to 1.5 for whichever came first; shown both ways
    round, the two verdicts cancel. The statistics say what happened."""
    groups = [(user("Q"), ["fine", "meh"]), (user("R"), ["great", "poor"])]
    with stand_in_server(StandIn()) as url, make_client(url, both_orders=True) as client:
        result = client.judge(groups)
    assert result.rewards == [[3.0, 3.0], [5.0, 1.0]] and result.valid == [[True, True], [True, True]]
    assert [(a.group, a.pair) for a in result.answers] == [(0, (0, 1)), (0, (1, 0)), (1, (0, 1)), (1, (1, 0))]
    assert result.stats["comparisons"] == 4
    # the first shown won both tie verdicts and one of the two others
    assert result.stats["first_position_rate"] == 0.75 and result.stats["contradiction_rate"] == 0.0
    with stand_in_server(StandIn()) as url, make_client(url) as client:
        once = client.judge(groups)
    assert once.rewards == [[4.5, 1.5], [5.0, 1.0]] and once.stats["first_position_rate"] == 1.0


def _models(entry: dict) -> dict:
    return {"object": "list", "data": [{"id": "other-model", "object": "model"}, {"object": "model", **entry}]}


@pytest.mark.parametrize(
    ("models", "once"),
    [
        (_models({"id": "judge-model", "rlsteps": {"position_independent": True}}), True),
        (None, False),  # no /v1/models route: says nothing
        (_models({"id": "judge-model"}), False),  # vLLM's and NIM's entries: nothing said
        (_models({"id": "another", "rlsteps": {"position_independent": True}}), False),  # of another model
        (_models({"id": "judge-model", "rlsteps": {"position_independent": "yes"}}), False),  # true, or nothing
        ({"data": "no list"}, False),
    ],
)
def test_a_judge_that_says_position_cannot_sway_it_is_shown_each_pair_once(models, once):
    """Both orders are asked for (the default); the judge's entry in /v1/models decides, asked once a client.
    Shown once, a judge that favours the first shown would keep its tie wins: the StandIn does favour it, so the
    rewards show which way the client went."""
    stand_in = StandIn(models)
    groups = [(user("Q"), ["fine", "meh"]), (user("R"), ["great", "poor"])]
    with stand_in_server(stand_in) as url, make_client(url, both_orders=True) as client:
        first, second = client.judge(groups), client.judge(groups[:1])
    assert len(stand_in.models_asked) == 1 and stand_in.models_asked[0]["Authorization"] == "Bearer sk-test"
    assert client.position_independent is once
    assert first.stats["comparisons"] == (2 if once else 4) and second.stats["comparisons"] == (1 if once else 2)
    assert first.rewards == ([[4.5, 1.5], [5.0, 1.0]] if once else [[3.0, 3.0], [5.0, 1.0]])
    # which position won says nothing of the judge when each pair is shown once because it said so
    assert ("first_position_rate" in first.stats) is not once


def test_a_client_showing_one_order_asks_the_judge_nothing():
    stand_in = StandIn(_models({"id": "judge-model", "rlsteps": {"position_independent": True}}))
    with stand_in_server(stand_in) as url, make_client(url) as client:
        result = client.judge([(user("Q"), ["fine", "meh"])])
    assert stand_in.models_asked == [] and result.stats["first_position_rate"] == 1.0


def test_structured_output_can_be_switched_and_extra_body_passes_through():
    stand_in = StandIn()
    extra = {"guided_decoding_backend": "xgrammar", "chat_template_kwargs": {"thinking": False}, "top_p": 0.5}
    with stand_in_server(stand_in) as url:
        with make_client(url, structured_output="none", extra_body=extra) as client:
            client.judge([(user("Q"), ["great", "poor"])])
        with make_client(url, structured_output="json_object") as client:
            client.judge([(user("Q"), ["great", "poor"])])
    plain, json_object = stand_in.bodies[0], stand_in.bodies[-1]
    assert "response_format" not in plain
    assert plain["guided_decoding_backend"] == "xgrammar" and plain["chat_template_kwargs"] == {"thinking": False}
    assert plain["top_p"] == 0.5  # extra_body is merged last: it overrides
    assert json_object["response_format"] == {"type": "json_object"}
    with pytest.raises(ValueError, match="json_schema, json_object, none"):
        make_client(url, structured_output="grammar")


def test_client_masks_responses_whose_comparisons_never_parse():
    stand_in = StandIn()
    with stand_in_server(stand_in) as url, make_client(url, max_retries=2) as client:
        result = client.judge([(user("Q"), ["great", "babble"]), (user("R"), ["great", "poor"])])
    assert result.rewards == [[DEFAULT_SCORE, DEFAULT_SCORE], [5.0, 1.0]]
    assert result.valid == [[False, False], [True, True]]
    assert result.stats["parse_failures"] == 1
    assert stand_in.attempts["great|babble"] == 3  # the first try and two retries
    babble = result.answers[0]
    assert babble.failure == "parse" and babble.content == "Both responses are wonderful {not json"
    assert "no JSON object" in babble.error and result.parse_failure_rate == 0.5
    assert babble.as_record()["outcome"] == "parse"


def test_client_retries_server_errors():
    stand_in = StandIn()
    with stand_in_server(stand_in) as url, make_client(url) as client:
        result = client.judge([(user("Q"), ["flaky", "poor"])])
    # HTTP 500 on the first try, the answer on the second
    assert stand_in.attempts["flaky|poor"] == 2
    assert result.rewards == [[4.0, 1.0]] and result.valid == [[True, True]]
    assert result.stats["retries"] == 1 and result.stats["transport_failures"] == 0


def test_judge_down_raises_unavailable_quickly():
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    start = time.monotonic()
    with make_client(url, max_retries=1) as client, pytest.raises(JudgeUnavailable) as info:
        client.judge([(user("Q"), ["a", "b", "c"])])
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert url in message and "3 comparisons" in message and "2 attempts" in message
    assert "rlsteps serve judge" in message


def test_unknown_pairing_fails_at_construction():
    with pytest.raises(ValueError, match="pairing"):
        JudgeClient("http://127.0.0.1:1/v1", "m", pairing="ring")


def test_no_comparisons_at_all_is_not_an_outage():
    with make_client("http://127.0.0.1:9/v1") as client:
        result = client.judge([(user("Q"), ["only"])])
    assert result.rewards == [[DEFAULT_SCORE]] and result.valid == [[False]]


# --- the burst: a step's comparisons go out together, up to judge.concurrency ---------------------


class Gathering(StandIn):
    """Holds each answer until `wave` requests are in flight at once (or 5 s pass), records the most seen at once,
    and answers the later comparisons of a wave first, so answers come back out of order."""

    def __init__(self, wave: int) -> None:
        super().__init__()
        self.wave, self.in_flight, self.most = wave, 0, 0
        self.arrived = 0
        self.changed = threading.Condition(self.lock)

    def answer(self, body: dict) -> tuple[int, str]:
        with self.changed:
            self.in_flight += 1
            self.arrived += 1
            order = self.arrived
            self.most = max(self.most, self.in_flight)
            self.changed.notify_all()
            self.changed.wait_for(lambda: self.most >= self.wave, timeout=5)
        time.sleep(0.02 * (self.wave - order % self.wave))  # the last to arrive of a wave answers first
        with self.changed:
            self.in_flight -= 1
        request = parse_judge_request(body["messages"])
        first, second = request.response_1, request.response_2
        if "babble" in (first, second):
            return 200, "no judgement here"
        if "broken" in (first, second):
            return 404, "no such model"
        s1, s2 = QUALITY[first], QUALITY[second]
        return 200, json.dumps({"score_1": s1, "score_2": s2, "ranking": 2 if s1 == s2 else (1 if s1 > s2 else 6)})


def test_a_step_goes_out_as_one_burst_of_at_most_concurrency_requests_and_comes_back_in_order():
    names = ["great", "fine", "poor", "meh"]
    groups = [(user(f"Q{g}"), [names[(g + k) % 4] for k in range(4)]) for g in range(4)]  # 16 comparisons
    for concurrency, wave in ((4, 4), (32, 16)):  # a burst as wide as the client allows, or as the step needs
        stand_in = Gathering(wave)
        with stand_in_server(stand_in) as url, make_client(url, concurrency=concurrency) as client:
            result = client.judge(groups)
        assert stand_in.most == wave
        assert [(a.group, a.pair) for a in result.answers] == [
            (g, pair) for g in range(4) for pair in comparison_pairs(4, "circular")
        ]
        for (_, responses), answers in zip(groups, [result.answers[4 * g : 4 * g + 4] for g in range(4)]):
            for answer in answers:  # each answer is its own comparison's
                first, second = (responses[i] for i in answer.pair)
                assert json.loads(answer.content)["score_1"] == QUALITY[first]
                assert json.loads(answer.content)["score_2"] == QUALITY[second]
        # each response's mean score over its two comparisons (a tie of 3 and 3 is ranked 2: +1.5 / -1.5)
        expected = {"great": 5.0, "poor": 1.0}
        for (_, responses), rewards in zip(groups, result.rewards):
            for name, reward in zip(responses, rewards):
                if name in expected:
                    assert reward == expected[name]
        assert result.valid == [[True] * 4] * 4 and result.stats["comparisons"] == 16


def test_failures_in_a_burst_are_counted_where_they_happened():
    groups = [
        (user("A"), ["great", "poor"]),  # ok
        (user("B"), ["great", "babble"]),  # never parses: 1 + 2 retries
        (user("C"), ["broken", "poor"]),  # HTTP 404: not retried
        (user("D"), ["fine", "poor"]),  # ok
    ]
    stand_in = Gathering(4)
    with stand_in_server(stand_in) as url, make_client(url, concurrency=8, max_retries=2) as client:
        result = client.judge(groups)
    assert [a.failure for a in result.answers] == [None, "parse", "transport", None]
    assert result.stats["comparisons"] == 4 and result.stats["parse_failures"] == 1
    assert result.stats["transport_failures"] == 1 and result.stats["retries"] == 2
    assert result.parse_failure_rate == 0.25
    assert result.answers[2].error.startswith("HTTP 404") and result.answers[2].content is None
    assert result.rewards == [[5.0, 1.0], [DEFAULT_SCORE, DEFAULT_SCORE], [DEFAULT_SCORE, DEFAULT_SCORE], [3.0, 1.0]]
    assert result.valid == [[True, True], [False, False], [False, False], [True, True]]
