"""One file per recipe, its math and its prepare/loss in the order the math is written: rs (rejection
sampling), reinforce (REINFORCE with the RLOO baseline), grpo (GRPO); recipe (what a recipe is), groups
(sums over prompt-id groups). Which class runs an algorithm is its registration's (rlsteps.contract.algorithms)."""

from importlib import import_module

from rlsteps.contract.algorithms import ALGORITHMS, UnsupportedAlgorithm, algorithm
from rlsteps.engine.algorithms.recipe import Recipe


def recipe_class(name: str) -> type[Recipe]:
    """The recipe class registered for an algorithm; UnsupportedAlgorithm naming it where the engine has none."""
    registered = algorithm(name).engine_class
    module, _, class_name = registered.partition(":")
    try:
        found = getattr(import_module(module), class_name)
    except (ImportError, AttributeError) as missing:
        raise UnsupportedAlgorithm(
            f"algorithm '{name}' is registered with {registered}, which the engine cannot load ({missing})"
        ) from None
    if not (isinstance(found, type) and issubclass(found, Recipe)):
        raise UnsupportedAlgorithm(f"algorithm '{name}' is registered with {registered}, which is not a Recipe")
    return found


RECIPES: dict[str, type[Recipe]] = {name: recipe_class(name) for name in ALGORITHMS}
