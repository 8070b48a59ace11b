"""Launchers: one module per backend behind one interface."""
