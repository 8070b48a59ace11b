"""Token log-probs of the policy in the RolloutBatch layout.

A [B, T-1] tensor whose entry t is log p(token t+1 | tokens <= t), always computed in fp32 whatever the
model's dtype; old, new and reference log-probs share that layout, so they subtract cleanly.
"""

from __future__ import annotations

import torch
from torch import nn

from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.policy.model import eval_mode


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T]
    """Positions count real tokens only, so left or right padding never shifts them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model: nn.Module, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log p(token t+1 | tokens <= t) for right-padded rows: [B, T] -> [B, T-1] fp32, 0 on padding."""
    logits = model(
        input_ids=tokens, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    ).logits  # [B, T, V]
    logprobs = logits[:, :-1].float().log_softmax(-1)  # [B, T-1, V]
    picked = logprobs.gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [B, T-1]
    return torch.where(attention_mask[:, 1:].bool(), picked, 0.0)


def batched_token_logprobs(model: nn.Module, batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
    """token_logprobs over micro-batches without gradients, at the batch's full width [B, T-1].

    Old, new and reference log-probs computed this way share one layout, so they subtract cleanly.
    """
    device = next(model.parameters()).device
    out = torch.zeros(len(batch), batch.tokens.shape[1] - 1)
    row = 0
    with torch.no_grad(), eval_mode(model):
        for micro in batch.micro_batches(micro_batch_size):
            logprobs = token_logprobs(model, micro.tokens.to(device), micro.attention_mask().to(device))
            out[row : row + len(micro), : logprobs.shape[1]] = logprobs.cpu()
            row += len(micro)
    return out.to(batch.tokens.device)
