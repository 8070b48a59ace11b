"""rlsteps: a step-based command line for online RL post-training of language models.

From Python: `rlsteps.run(step, config=..., overrides=..., rewards=...)` runs a step here and returns its `Run`
(rlsteps.api); importing rlsteps imports nothing else.
"""

from typing import Any

from rlsteps.install import VERSION as __version__  # noqa: F401  (the standard library only)


def __getattr__(name: str) -> Any:
    if name in ("run", "Run"):
        from rlsteps import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlsteps' has no attribute {name!r}")
