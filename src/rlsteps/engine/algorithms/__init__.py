"""One file per recipe, its math and its prepare/loss in the order the math is written: rs (rejection
sampling), reinforce (REINFORCE with the RLOO baseline), grpo (GRPO); recipe (what a recipe is), groups
(sums over prompt-id groups)."""

from rlsteps.engine.algorithms.grpo import GRPO
from rlsteps.engine.algorithms.recipe import Recipe
from rlsteps.engine.algorithms.reinforce import ReinforceRLOO
from rlsteps.engine.algorithms.rs import RejectionSampling

RECIPES: dict[str, type[Recipe]] = {"rs": RejectionSampling, "reinforce": ReinforceRLOO, "grpo": GRPO}
