"""Launchers: one module per backend (local, slurm, lepton) behind one interface (base), the frozen Job they
run (job), and squashed containers (containers)."""
