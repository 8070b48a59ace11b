"""Artifacts: what a reference holds (detect), a step's inputs against its manifest (inputs), the store (store)."""
