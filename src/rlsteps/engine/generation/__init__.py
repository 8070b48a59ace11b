"""Generation: the Sampler the loop asks for rollouts, and the backends that sample behind it (built-in first)."""
