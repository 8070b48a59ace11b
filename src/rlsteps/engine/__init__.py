"""The embedded RL engine: pure PyTorch over Hugging Face causal LMs. Imports nothing from the CLI side."""
