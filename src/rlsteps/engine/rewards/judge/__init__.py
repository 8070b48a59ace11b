"""The generative judge: protocol (pairs, request, answer shape), parsing, scoring, client, and a tiny server."""
