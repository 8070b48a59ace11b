"""checkpoint_megatron: Megatron-Core distributed checkpoints of Hugging Face causal LMs.

layout.py maps tensor names and layouts (families.py: each family's layer tensors), providers.py writes and
reads run_config.yaml's model provider, format.py reads and writes the folders through
megatron.core.dist_checkpointing, compat.py lets that run on a CPU in one process, common_state.py finds the
common state where a later megatron-core (and so Megatron-Bridge) keeps it, and gpt_model.py
loads a checkpoint into megatron-core's own GPTModel to check it. The folder's names, and finding one, are the
contract's (rlsteps.contract.megatron_files): the command line finds checkpoints through them without torch.
"""
