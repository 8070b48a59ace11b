"""The eval/policy step: a policy's responses generated, scored by the RL steps' reward sources and reported."""
