"""Reward sources: the HTTP reward-model server and client, and the generative judge."""
