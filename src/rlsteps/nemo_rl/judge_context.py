"""The judge's context against what the policy can write; pure.

NeMo-Gym's genrm_compare sends the judge the conversation (the prompt) and two of the policy's answers, in the
judge's chat template, and lets it write genrm_responses_create_params.max_output_tokens. A request longer than
the judge's vLLM max_model_len fails, and genrm_compare turns any failed comparison into its default score for
both answers (its _run_single_comparison): a group whose answers are all long gets equal rewards, every advantage
zero, and the run learns nothing from it without a word. So the judge's max_model_len must hold the longest such
request: the longest prompt plus twice the longest answer after it (the policy's answers are bounded by
policy.generation.max_new_tokens and by policy.max_total_sequence_length less the prompt), the judge's answer, and
an allowance for its template.
"""

from __future__ import annotations

from typing import Any

from rlsteps.dotted import get
from rlsteps.nemo_rl.environments import NemoRlConfigError
from rlsteps.nemo_rl.key_map import GENRM, JUDGE

TEMPLATE_ALLOWANCE = 512  # tokens for the judge's chat template and role markers around the three texts
JUDGE_LEN = JUDGE + ".vllm_serve_kwargs.max_model_len"  # the user's key
COMPILED_JUDGE = "env.nemo_gym.genrm_model.responses_api_models.genrm_model"


def longest_request(master: dict[str, Any]) -> tuple[int, str]:
    """The longest judge request a step can make, in tokens, and how it adds up."""
    policy = master["policy"]
    total, prompt = policy["max_total_sequence_length"], master["data"]["max_input_seq_length"] or 1
    new = policy["generation"].get("max_new_tokens") or total
    prompt = min(prompt, total - 1)

    def request(length: int) -> int:  # a prompt of `length` tokens and two answers after it
        return length + 2 * min(new, total - length)

    lengths = {1, prompt} | ({total - new} if 1 <= total - new <= prompt else set())
    worst = max(lengths, key=request)
    answer = min(new, total - worst)
    output = int(get(master, f"{GENRM}.genrm_responses_create_params.max_output_tokens") or 0)
    tokens = request(worst) + output + TEMPLATE_ALLOWANCE
    said = (
        f"a {worst}-token prompt + 2 answers of {answer} + the judge's answer of {output} + {TEMPLATE_ALLOWANCE} for "
        f"its template = {tokens}"
    )
    return tokens, said


def check_judge_context(master: dict[str, Any]) -> list[str]:
    """Refuses a judge whose max_model_len cannot hold the longest request (the fix: one that can); notes."""
    server = get(master, COMPILED_JUDGE)
    if not server:
        return []
    length = (server.get("vllm_serve_kwargs") or {}).get("max_model_len")
    tokens, said = longest_request(master)
    if length is None:
        return [f"the judge's max_model_len is its model's own, not known here: its requests reach {said} tokens"]
    if length < tokens:
        raise NemoRlConfigError(
            f"the judge's max_model_len {length} cannot hold what it is asked to compare: {said} tokens; NeMo-Gym's "
            "genrm_compare scores a failed comparison with its default score for both answers, so long groups would "
            "train on zero advantages without a word",
            changes={JUDGE_LEN: _rounded(tokens)},
        )
    return []


def _rounded(tokens: int) -> int:
    return -(-tokens // 1024) * 1024
