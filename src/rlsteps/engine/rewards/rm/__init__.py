"""The scalar reward model: its scorer, its HTTP server (dynamic batching) and the client the loop uses."""
