"""checkpoint_megatron: Megatron-Core distributed checkpoints of Hugging Face causal LMs.

layout.py maps tensor names and layouts, checkpoint.py reads and writes the folders through
megatron.core.dist_checkpointing, compat.py lets that run on a CPU in one process, and gpt_model.py
loads a checkpoint into megatron-core's own GPTModel to check it. This module itself is torch-free.
"""

TRACKER_FILE = "latest_checkpointed_iteration.txt"  # Megatron-LM's pointer to the latest iter_* folder
