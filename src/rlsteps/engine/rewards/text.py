"""The one definition of the text a scalar reward model scores.

The reward model is trained on exactly this string (see rlsteps.tiny) and served on it
(see scorer.py), so training and serving can never tokenise differently.
"""


def reward_input_text(prompt: str, response: str, eos_token: str | None) -> str:
    """The rendered prompt the policy saw, its decoded response, and the reward tokenizer's EOS."""
    return f"{prompt}{response}{eos_token or ''}"
