"""Reward functions named in a config ("package.module:function"), computed in the training process.

The protocol, one sample at a time:

    def exact_match(messages, response, answer=None) -> float | None: ...

- messages: the prompt as chat messages ([{"role", "content"}], free of template markup);
- response: the decoded response;
- the prompt line's other keys (e.g. "answer" of {"messages": [...], "answer": "Paris"}), passed by name where the
  signature has a parameter of that name (or takes **kwargs);
- returns a float, or None for "no reward" (the sample leaves the loss, as a failed judge comparison does).

With `batched: true` the function is called once per step with lists (messages of every sample, responses, each
field as a list) and returns a list. A function that raises, returns NaN or infinity, or returns something not a
number is an error naming the function and the sample; one that runs past `timeout_s` over a step's samples too.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING, Any

from rlsteps.engine.call_site import raised_at

if TYPE_CHECKING:
    from rlsteps.engine.batch import RolloutBatch

RewardFunction = Callable[..., Any]
SHOWN_CHARACTERS = 120  # of a response quoted in an error


class RewardFunctionError(ValueError):
    """A reward function spec that does not name an importable callable."""


class RewardFunctionFailed(RuntimeError):
    """A reward function that raised, returned something unusable or took too long: the run stops (after a
    checkpoint), naming the function and the sample."""


def load_reward_function(spec: str) -> RewardFunction:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise RewardFunctionError(f"reward function {spec!r} must read 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise RewardFunctionError(f"reward function {spec!r}: cannot import {module_name}: {error}") from None
    except SystemExit as exiting:  # the module's own code ended the process: said as the failure it is
        raise RewardFunctionError(f"reward function {spec!r}: importing {module_name} {_exit_call(exiting)}") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise RewardFunctionError(f"reward function {spec!r}: {module_name} has no callable {attribute!r}")
    return function


def accepted_fields(function: RewardFunction, fields: set[str]) -> set[str]:
    """The prompt fields the function takes by name: all of them with **kwargs, else those its parameters name."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: positional arguments only
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return set(fields)
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return fields & named


@dataclass
class FunctionScorer:
    """One reward function applied to a batch: per-row rewards (None: no reward) or RewardFunctionFailed."""

    name: str  # the config's name for it: rewards.<name> or validation.reward_functions.<name>
    spec: str
    function: RewardFunction
    batched: bool = False
    timeout_s: float | None = None

    @classmethod
    def load(cls, name: str, spec: str, batched: bool = False, timeout_s: float | None = None) -> FunctionScorer:
        return cls(name, spec, load_reward_function(spec), batched, timeout_s)

    def __call__(self, batch: RolloutBatch) -> list[float | None]:
        if not len(batch):
            return []
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"reward-{self.name}")
        try:
            future = pool.submit(self._scores, batch)
            try:
                values = future.result(timeout=self.timeout_s)
            except concurrent.futures.TimeoutError:
                raise RewardFunctionFailed(
                    f"reward function {self.name} ({self.spec}) took more than {self.timeout_s:g} s over "
                    f"{len(batch)} samples; make it faster or raise its timeout_s"
                ) from None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # a function still running is left to finish on its own
        return [self._checked(value, batch, row) for row, value in enumerate(values)]

    def _scores(self, batch: RolloutBatch) -> list[Any]:
        conversations = [batch.conversation(i) for i in range(len(batch))]
        rows = [batch.fields_of(i) for i in range(len(batch))]
        taken = accepted_fields(self.function, {key for row in rows for key in row})
        if self.batched:
            return self._batched(conversations, batch.response_texts, {k: [row.get(k) for row in rows] for k in taken})
        values = []
        for i, (messages, response) in enumerate(zip(conversations, batch.response_texts)):
            try:
                values.append(self.function(messages, response, **{k: rows[i][k] for k in taken if k in rows[i]}))
            except SystemExit as exiting:
                raise RewardFunctionFailed(f"{self._where(batch, i)} {_exit_call(exiting)}") from None
            except Exception as error:
                raise RewardFunctionFailed(f"{self._where(batch, i)} raised {type(error).__name__}: {error}") from error
        return values

    def _batched(self, conversations: list, responses: list[str], fields: dict[str, list]) -> list[Any]:
        try:
            values = self.function(conversations, responses, **fields)
        except SystemExit as exiting:
            raise RewardFunctionFailed(
                f"reward function {self.name} ({self.spec}) on a batch of {len(responses)} samples "
                + _exit_call(exiting)
            ) from None
        except Exception as error:
            raise RewardFunctionFailed(
                f"reward function {self.name} ({self.spec}) raised {type(error).__name__} on a batch of "
                f"{len(responses)} samples: {error}"
            ) from error
        if not isinstance(values, list | tuple) or len(values) != len(responses):
            got = f"{len(values)} values" if isinstance(values, list | tuple) else type(values).__name__
            raise RewardFunctionFailed(
                f"reward function {self.name} ({self.spec}) is batched and returned {got} for {len(responses)} "
                "samples: return one float (or None) per sample, in order"
            )
        return list(values)

    def _checked(self, value: Any, batch: RolloutBatch, row: int) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, Real):
            raise RewardFunctionFailed(f"{self._where(batch, row)} returned {value!r}: return a float or None")
        if not math.isfinite(value):
            raise RewardFunctionFailed(f"{self._where(batch, row)} returned {value}: return a finite float or None")
        return float(value)

    def _where(self, batch: RolloutBatch, row: int) -> str:
        response = batch.response_texts[row]
        shown = response if len(response) <= SHOWN_CHARACTERS else response[:SHOWN_CHARACTERS] + "..."
        return (
            f"reward function {self.name} ({self.spec}) on sample {row} "
            f"(prompt {batch.prompt_ids[row]!r}, response {shown!r})"
        )


def _exit_call(exiting: SystemExit) -> str:
    """A SystemExit from user code in words: what it called and where (the innermost frame), and that it is refused."""
    return (
        f"called sys.exit({exiting.code!r}){raised_at(exiting)}: a reward function returns a float or None and "
        "never ends the process"
    )
