"""Generation: the request and result every backend shares (params), the built-in KV-cache sampler (builtin),
and the rollouts the loop asks for (rollout: a Sampler over one backend, prompts in, a RolloutBatch out)."""
