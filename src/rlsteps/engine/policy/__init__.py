"""The policy: the model and its load/save (model), its token log-probs (logprobs), its optimisation (optim)."""
