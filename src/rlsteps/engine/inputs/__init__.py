"""What a run trains on: its prompts read (through rlsteps.contract.prompts, where the input checks also live) and
their order."""
