"""NeMo-Aligner's reward server as the tests' counterpart: the tiny reward model behind a real PyTriton (Triton's
server and its HTTP inference protocol), bound as NeMo-Aligner's RewardModelServer binds its model.

The names, types and shapes are NeMo-Aligner's (nemo_aligner/algorithms/reward_server.py at its final commit):
the model `reward_model` (serve_reward_model.py's inference.model_name); the optional inputs `sentences` (bytes,
[-1]), `tokens` and `sequence_lengths` (int64, [-1]); the output `rewards` (float32, [1]); batching with a dynamic
batcher (2 ms queue delay, inference.max_queue_delay_microseconds) and no practical batch limit. As there, a row of
tokens is read up to its sequence length (the padding after it is the client's), and sentences are tokenised
without BOS or EOS. The model itself is the tiny world's reward model through transformers, where NeMo-Aligner's is
a Megatron GPT with a reward head; the reward is its score at the last token of each row.

Runs in .venv-triton (tests/make_triton_env.sh: PyTriton needs numpy<2), with tests/ on the path:

    .venv-triton/bin/python -m triton_reward_server --model REWARD_MODEL_DIR [--host 127.0.0.1] [--port 5555]
"""

from __future__ import annotations

import argparse
import os
import sysconfig

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from transformers import AutoModelForSequenceClassification, AutoTokenizer

MODEL_NAME = "reward_model"
MAX_BATCH = 9999999  # NeMo-Aligner cuts a batch into micro-batches itself, so it sets no practical limit
INPUTS = (
    Tensor(name="sentences", shape=(-1,), dtype=bytes, optional=True),
    Tensor(name="tokens", shape=(-1,), dtype=np.int64, optional=True),
    Tensor(name="sequence_lengths", shape=(-1,), dtype=np.int64, optional=True),
)
OUTPUTS = (Tensor(name="rewards", shape=(1,), dtype=np.float32),)


def python_library_first() -> None:
    """Triton runs the bound function through a stub linked against libpython: this interpreter's, not another
    build of the same version (a system one), whose modules differ from this interpreter's standard library."""
    library = sysconfig.get_config_var("LIBDIR")
    if library:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [library, os.environ.get("LD_LIBRARY_PATH")]))


def serve(model_dir: str, host: str, port: int) -> None:
    python_library_first()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad_id = model.config.pad_token_id

    def token_rows(inputs: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, L] token ids and [B] lengths, from the tokens the client sent or the sentences it sent."""
        if "sentences" in inputs:
            texts = [row[0].decode() for row in inputs["sentences"]]
            encoded = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
            return encoded["input_ids"], encoded["attention_mask"].sum(dim=1)
        return torch.as_tensor(inputs["tokens"]), torch.as_tensor(inputs["sequence_lengths"]).reshape(-1)

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        tokens, lengths = token_rows(inputs)
        kept = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]  # [B, L]
        input_ids = torch.where(kept, tokens, torch.full_like(tokens, pad_id))  # the model finds the last real token
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=kept.long()).logits  # [B, 1]
        return {"rewards": logits.float().numpy()}

    config = TritonConfig(allow_http=True, allow_grpc=False, allow_metrics=False, http_address=host, http_port=port)
    batching = ModelConfig(
        batching=True, max_batch_size=MAX_BATCH, batcher=DynamicBatcher(max_queue_delay_microseconds=2000)
    )
    with Triton(config=config) as triton:
        triton.bind(model_name=MODEL_NAME, infer_func=infer, inputs=INPUTS, outputs=OUTPUTS, config=batching)
        triton.serve()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a one-label sequence-classification model's folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5555)  # NeMo-Aligner's inference.port
    options = parser.parse_args()
    serve(options.model, options.host, options.port)
