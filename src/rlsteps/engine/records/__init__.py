"""What a run leaves on record: its metrics and plots, throughput, the samples of what the policy said, and the typed
output artifact written (its metadata is the contract's: rlsteps.contract.artifact)."""
