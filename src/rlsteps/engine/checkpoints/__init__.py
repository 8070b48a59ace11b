"""What lets a run stop and resume: step checkpoints, the weights and optimizer state in them, their integrity, and a
resumed run's records cut back to them (their names and the disk they need are the contract's)."""
