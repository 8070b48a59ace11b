"""The generative judge as a reward source: a prompt's responses compared pairwise, each row's reward and its
answers; greedy validation's single responses compared with the initial policy's; the failure and parse limits."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlsteps.engine.rewards.judge.scoring import DEFAULT_SCORE
from rlsteps.engine.rewards.scores import Scores, nothing_to_wait_for

if TYPE_CHECKING:
    from rlsteps.engine.batch import RolloutBatch

log = logging.getLogger(__name__)


class JudgeSource:
    """A generative judge comparing the responses of each prompt pairwise over a chat API."""

    shown_answers = 3  # unparsable answers quoted when they stop the run

    def __init__(
        self,
        client,
        length_penalty: float = 0.0,
        on_failure: str = "mask",
        max_parse_failure_rate: float = 0.5,
        ready: Callable[[], None] = nothing_to_wait_for,
        max_failure_rate: float = 0.1,
        reference_path: Path | None = None,
    ) -> None:
        self.client = client
        self.ready = ready  # returns once the server answers (a local server still loading)
        self.length_penalty = length_penalty
        self.on_failure = on_failure  # mask: failed comparisons leave the loss; stop: any failure stops the run
        self.max_parse_failure_rate = max_parse_failure_rate
        self.max_failure_rate = max_failure_rate  # of comparisons failed in transport, above which a step stops
        self.reference_path = reference_path  # the first greedy validation's responses, which later ones meet
        self.transport_failures = 0  # over the run, for its end summary

    def score(self, batch: RolloutBatch) -> Scores:
        import torch

        from rlsteps.engine.rewards.judge.scoring import length_penalty

        self.ready()
        group, num_groups = batch.group_index()
        rows = [torch.nonzero(group == g).flatten().tolist() for g in range(num_groups)]
        requests = [(batch.conversation(r[0]), [batch.response_texts[i] for i in r]) for r in rows]
        result = self.client.judge(requests)  # raises JudgeUnavailable when every comparison failed
        self._stop_on_failures(result)
        rewards, valid = torch.zeros(len(batch)), torch.zeros(len(batch), dtype=torch.bool)
        for g, members in enumerate(rows):
            group_rewards = result.rewards[g]
            if self.length_penalty:
                lengths = [int(batch.response_lengths[i]) for i in members]
                group_rewards = length_penalty(group_rewards, lengths, self.length_penalty)
            rewards[members] = torch.tensor(group_rewards, dtype=torch.float32)
            valid[members] = torch.tensor(result.valid[g], dtype=torch.bool)
        metrics = {f"judge/{k}": float(v) for k, v in result.stats.items()}
        return Scores(rewards=rewards, valid=valid, metrics=metrics, details=_answers_by_row(result.answers, rows))

    def score_alone(self, batch: RolloutBatch) -> Scores:
        """One response per prompt, each compared with the response to the same prompt at the first greedy
        validation, the initial policy's (kept in the run folder, so a resumed run meets the same ones): a judge
        compares, and a single response has nothing else to meet. A response identical to its reference is not
        compared (a judge shown one text twice answers by position alone) and has no judge figure."""
        import torch

        references = self._references(batch)
        changed = [i for i in range(len(batch)) if batch.response_texts[i] != references[batch.prompt_ids[i]]]
        scores = Scores(
            rewards=torch.full((len(batch),), DEFAULT_SCORE),
            valid=torch.zeros(len(batch), dtype=torch.bool),
            details=[{"judge": [], "same_as_reference": True} for _ in range(len(batch))],
        )
        if not changed:
            return scores
        rows = [i for i in changed for _ in range(2)]  # each changed response beside its reference, one group each
        texts = [t for i in changed for t in (batch.response_texts[i], references[batch.prompt_ids[i]])]
        judged = self.score(dataclasses.replace(batch.select(rows), response_texts=texts))
        judged = judged.select(list(range(0, len(rows), 2)))
        scores.rewards[changed], scores.valid[changed] = judged.rewards, judged.valid
        for i, detail in zip(changed, judged.details):
            scores.details[i] = detail
        scores.metrics = judged.metrics
        return scores

    def _references(self, batch: RolloutBatch) -> dict[str, str]:
        known = (
            json.loads(self.reference_path.read_text()) if self.reference_path and self.reference_path.exists() else {}
        )
        new = {pid: text for pid, text in zip(batch.prompt_ids, batch.response_texts) if pid not in known}
        if new and self.reference_path is not None:
            partial = self.reference_path.with_suffix(".partial")
            partial.write_text(json.dumps({**known, **new}, indent=0))
            os.replace(partial, self.reference_path)
        return {**known, **new}

    def _stop_on_failures(self, result) -> None:
        from rlsteps.engine.rewards.judge.client import JudgeAnswersUnusable, JudgeUnavailable

        failed = int(result.stats.get("transport_failures", 0))
        comparisons = max(len(result.answers), 1)
        self.transport_failures += failed
        if failed and self.on_failure == "stop":
            raise JudgeUnavailable(
                f"{failed} judge request(s) failed and judge.on_failure=stop "
                "(set judge.on_failure=mask to train on the rest)"
            )
        if failed / comparisons > self.max_failure_rate:
            raise JudgeUnavailable(
                f"{failed} of {comparisons} judge comparisons failed in transport, more than "
                f"judge.max_failure_rate={self.max_failure_rate:g}; the last error: {_last_transport_error(result)}"
            )
        if failed:
            log.warning(
                "%d of %d judge comparisons failed in transport; their responses leave this step's loss "
                "(judge.max_failure_rate=%g stops the run above that share)",
                failed,
                comparisons,
                self.max_failure_rate,
            )
        rate = result.parse_failure_rate
        if rate > self.max_parse_failure_rate:
            unparsable = [a for a in result.answers if a.failure == "parse"][: self.shown_answers]
            quoted = "\n".join(f"  - {a.error}" for a in unparsable)
            raise JudgeAnswersUnusable(
                f"the judge's answers did not parse in {rate:.0%} of {len(result.answers)} comparisons "
                f"(judge.max_parse_failure_rate={self.max_parse_failure_rate:g}); the last answers:\n{quoted}\n"
                "ask for structured output (judge.structured_output=json_schema, if the server supports it), "
                "raise judge.max_tokens, or use a judge that follows the JSON instruction"
            )


def _last_transport_error(result) -> str:
    errors = [a.error for a in result.answers if a.failure == "transport"]
    return errors[-1] if errors else "unknown"


def _answers_by_row(answers, rows: list[list[int]]) -> list[dict]:
    """Each row's judge answers (the comparisons it took part in), keyed for its sample record."""
    details: dict[int, list[dict]] = {i: [] for members in rows for i in members}
    for answer in answers:
        members = rows[answer.group]
        for position in answer.pair:
            details[members[position]].append(answer.as_record())
    return [{"judge": details[i]} for i in sorted(details)]
