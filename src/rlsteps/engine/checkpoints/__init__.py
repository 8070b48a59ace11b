"""What lets a run stop and resume: step checkpoints, the weights and optimizer state in them, and the disk they
need."""
