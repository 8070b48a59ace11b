"""Reward functions named in a config ("package.module:function"): extra rewards computed in process.

A function takes (prompt, response): the prompt as the policy saw it (rendered) and the decoded response,
and returns a float. Validation logs the mean of each as val/<name>, beside the reward source's reward;
the tiny world's hidden true reward is one (rlsteps.tiny.task:true_reward).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

RewardFunction = Callable[[str, str], float]


class RewardFunctionError(ValueError):
    """A reward function spec that does not name an importable callable."""


def load_reward_function(spec: str) -> RewardFunction:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise RewardFunctionError(f"reward function {spec!r} must read 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise RewardFunctionError(f"reward function {spec!r}: cannot import {module_name}: {error}") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise RewardFunctionError(f"reward function {spec!r}: {module_name} has no callable {attribute!r}")
    return function


def load_reward_functions(specs: dict[str, str]) -> dict[str, RewardFunction]:
    return {name: load_reward_function(spec) for name, spec in specs.items()}
