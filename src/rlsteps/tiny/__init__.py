"""The offline tiny world: a task with a hidden preference, a tokenizer, an SFT policy, a reward model and prompts.

task (the synthetic task and its true reward), layout (where a world lives; torch-free), recipe (sizes and
steps), tokenizer, models, training (SFT, Bradley-Terry), evaluate (measured quality), build (cache, lock, the
atomic build: `ensure_tiny_world`).
"""
