"""What a NeMo-RL job runs around NeMo-RL's driver, inside NeMo-RL's container (the compile that writes the job is
rlsteps.nemo_rl's): data (prompt rows as NeMo-RL's datasets read them), stages (`prepare` and `finish` around
NeMo-RL's driver), ray_nodes (the head's wait for every node's Ray), run as `python -m rlsteps.engine.nemo_rl_stages`.
"""
