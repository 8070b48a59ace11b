"""Rewards for rollouts: the scalar reward model (rm/), the generative judge (judge/), the sources the loop
scores with (sources), local server processes (process), the servers' shared command-line pieces
(serve_command), bearer tokens (auth) and the reward model's input text."""
