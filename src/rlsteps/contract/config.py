"""Typed configuration of the RL recipes: one pydantic schema per algorithm (the reward terms' own sections are in
contract.reward_config).

The compiler validates a merged config against these before anything is launched, and the worker
reads its config back through them. Torch-free on purpose: `rlsteps run --dry-run` imports this.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from rlsteps.contract.config_types import NonNegativeFloat, PositiveFloat, Probability, Section
from rlsteps.contract.prompts import template_kwargs
from rlsteps.contract.reward_config import (
    JUDGE_ONLY,
    REWARD_MODEL_ONLY,
    JudgeConfig,
    RewardEntry,
    RewardModelClientConfig,
    RewardTerms,
    checked_rewards,
)


class RunConfig(Section):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # bfloat16: bf16 compute over fp32 weights and fp32 optimizer state (mixed precision); float32: fp32 throughout
    dtype: Literal["float32", "bfloat16"] = "float32"
    num_threads: PositiveInt | None = None
    offload_reference: bool = False  # one process: keep the frozen reference policy in CPU memory between passes
    # the reference's log-probs computed while the rewards are scored (where the recipe needs them of every row):
    # auto = on an accelerator; on a CPU both would share its cores (and the scoring threads the GIL), which is slower
    overlap_reference: bool | Literal["auto"] = "auto"


class Inputs(Section):
    model_config = ConfigDict(extra="allow", frozen=True)  # each step declares its own inputs
    prompts: str
    val_prompts: str | None = None
    policy: str


class DataConfig(Section):
    max_prompt_tokens: PositiveInt = 1024
    prompt_column: str | None = None  # the column (JSONL key) of each prompt; None: prompt, messages or a NeMo-Gym row
    split: str = "train"  # a prompt dataset's split for training, when it has several
    val_split: str | None = None  # and for validation; None: validation, else test
    chat_template_kwargs: Annotated[dict[str, Any] | None, AfterValidator(template_kwargs)] = None  # enable_thinking


class SamplingConfig(Section):
    max_new_tokens: PositiveInt = 512
    temperature: NonNegativeFloat = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: NonNegativeInt = 0


class VllmConfig(Section):
    """vLLM's engine (rollout.backend=vllm), in the training process or in the rollout process beside training
    (rollout.max_age_steps > 0, where it never sleeps): its memory and how it shares the device."""

    gpu_memory_utilization: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.3  # of the GPU, weights and KV cache; the
    # rest stays for training
    kv_cache_gb: PositiveFloat = 4.0  # on a CPU, the KV cache's size (vLLM's VLLM_CPU_KVCACHE_SPACE)
    enforce_eager: bool = False  # true: no CUDA graphs / torch.compile (faster start, slower decoding)
    sleep: bool = True  # on a GPU, free the KV cache and offload vLLM's weights while the policy trains


class RolloutConfig(Section):
    prompts_per_step: PositiveInt = 64
    num_rollouts_per_prompt: PositiveInt = 4
    top_n_rollouts: PositiveInt | None = None  # rejection sampling only
    # who samples: builtin (the policy itself, in this process), vllm (vLLM in this process, sent the new weights
    # after every update) or auto (vllm on a GPU where it is installed, else builtin)
    backend: Literal["auto", "builtin", "vllm"] = "auto"
    # rows per batch of the built-in sampler; None: sized to the device (engine.generation.sizing); vLLM batches itself
    generation_batch_size: PositiveInt | None = None
    logprob_micro_batch_size: PositiveInt = 8
    # how many optimizer steps older than the policy being trained a rollout may be: 0 samples on-policy (each step
    # draws its rollouts with the weights it trains); k > 0 samples beside training, the importance weights
    # correcting for the lag (engine=nemo_rl: NeMo-RL's grpo.async_grpo)
    max_age_steps: NonNegativeInt = 0
    sampling: SamplingConfig = SamplingConfig()
    vllm: VllmConfig = VllmConfig()

    @model_validator(mode="after")
    def _top_n_within_rollouts(self) -> RolloutConfig:
        if self.top_n_rollouts is not None and self.top_n_rollouts > self.num_rollouts_per_prompt:
            raise ValueError(
                f"rollout.top_n_rollouts ({self.top_n_rollouts}) exceeds rollout.num_rollouts_per_prompt "
                f"({self.num_rollouts_per_prompt}): a prompt cannot keep more rollouts than it has"
            )
        return self


class LoraConfig(Section):
    """Low-rank adapters (LoRA, through peft) on the policy's linear layers: only they train; the reference policy is
    the base with them switched off. NeMo-RL's policy.dtensor_cfg.lora_cfg names."""

    enabled: bool = False
    dim: PositiveInt = 8  # the adapters' rank
    alpha: PositiveInt = 32  # scaling: alpha / dim
    dropout: Probability = 0.0  # on the adapters' input
    # the adapters' learning rate, in place of train.lr (only they train); None: train.lr. Adapters learn at a larger
    # rate than a whole policy: the tiny configs give 3e-3 where full fine-tuning takes 1.2e-3 to 1.5e-3, whose rate
    # held a LoRA run at val/true_reward 1.56 of 3.0 (tiny world v17)
    lr: PositiveFloat | None = None
    # module names as peft matches them (a module whose dotted name is or ends with one, e.g. q_proj); empty: every
    # linear layer but the output layer
    target_modules: list[str] = []

    @model_validator(mode="after")
    def _named_modules(self) -> LoraConfig:
        blank = [name for name in self.target_modules if not name.strip() or "*" in name]
        if blank:
            raise ValueError(
                f"train.lora.target_modules: {blank[0]!r} is not a module name; name modules as they appear in the "
                "model (e.g. [q_proj, v_proj]), or leave the list empty for every linear layer but the output layer"
            )
        return self


class TrainConfig(Section):
    max_steps: PositiveInt = 100
    max_epochs: PositiveInt | None = None  # None: as many as train.max_steps needs
    global_batch_size: PositiveInt = 64
    micro_batch_size: PositiveInt = 1
    lr: PositiveFloat = 1e-6
    weight_decay: NonNegativeFloat = 0.1
    betas: tuple[Probability, Probability] = (0.9, 0.98)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: NonNegativeInt = 10
    min_lr_ratio: Probability = 0.1
    max_grad_norm: PositiveFloat = 1.0
    max_steps_without_update: NonNegativeInt = 3  # RL steps in a row with no update that stop the run; 0 = never
    # weigh each token's policy-gradient loss by min(p_trainer / p_sampler, importance_sampling_cap): corrects for
    # the sampler's log-probs differing from the trainer's (another engine, another precision); not for rs
    truncated_importance_sampling: bool = False
    importance_sampling_cap: PositiveFloat = 2.0
    activation_checkpointing: bool = False  # recompute each layer's activations in backward: less memory, more compute
    # the policy's training forward through torch.compile (inductor): the first steps pay the compiling (a minute
    # for a 0.37B policy), later ones run faster (1.87x the train phase of a 0.37B policy in bf16 on one H100). Its
    # passes take padded rows where sequence_packing is on: transformers' models lose the packed mask when compiled
    compile: bool = False
    # rollouts end to end in rows of the longest sequence a row can have (data.max_prompt_tokens +
    # rollout.sampling.max_new_tokens), each attending only to itself (NeMo-RL's sequence packing): micro_batch_size
    # such rows a pass, so no pass needs more memory than micro_batch_size padded rows, with far less padding where
    # lengths vary; the padded path's gradient to rounding. A model that attends across packed sequences is found
    # by a probe and passed padded rows (docs/scaling-out.md)
    sequence_packing: bool = True
    # micro-batches by tokens rather than rows (NeMo-RL's dynamic batching), the other way to cut padding: rows sorted
    # by length share a micro-batch while rows x its longest sequence stay within micro_batch_size x the longest a row
    # can have. Setting it turns sequence_packing off unless that is set too (both on is refused, as in NeMo-RL)
    dynamic_batching: bool = False
    lora: LoraConfig = LoraConfig()

    @model_validator(mode="before")
    @classmethod
    def _dynamic_batching_instead_of_packing(cls, data: Any) -> Any:
        """Sequence packing is on by default: dynamic batching asked for, and packing not, means packing off."""
        asked = isinstance(data, dict) and str(data.get("dynamic_batching")).lower() in ("true", "1")
        if asked and "sequence_packing" not in data:
            return {**data, "sequence_packing": False}
        return data

    @model_validator(mode="after")
    def _one_way_to_batch_by_tokens(self) -> TrainConfig:
        if self.dynamic_batching and self.sequence_packing:
            raise ValueError(
                "train.dynamic_batching and train.sequence_packing are two ways to batch by tokens; set one of them "
                "(sequence packing pads less: it fills rows with several rollouts)"
            )
        return self

    @model_validator(mode="after")
    def _micro_divides_global(self) -> TrainConfig:
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"train.global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"train.micro_batch_size ({self.micro_batch_size})"
            )
        return self

    @property
    def optimizer_lr(self) -> float:
        """The optimizer's peak rate: train.lora.lr where the adapters train and it is set, else train.lr."""
        return self.lora.lr if self.lora.enabled and self.lora.lr is not None else self.lr


class ValidationConfig(Section):
    interval: NonNegativeInt = 10
    num_prompts: PositiveInt = 64
    max_new_tokens: PositiveInt | None = None
    # 1: one greedy response per prompt, so the figures move only when the policy does; 2 or more: sampled at the
    # rollouts' temperature (a judge then compares them with each other, as in training)
    samples_per_prompt: PositiveInt = 1
    # figures logged as val/<name> and not trained on: "module:function", the reward-function protocol
    # (rlsteps.engine.rewards.functions)
    reward_functions: dict[str, str] = {}
    show_samples: NonNegativeInt = 2  # validation samples printed to the terminal


class CheckpointConfig(Section):
    interval: NonNegativeInt = 10
    keep_last: PositiveInt = 2
    keep_top_k: NonNegativeInt = 1
    metric: str | None = "val/reward_mean"
    start_over_if_damaged: bool = False  # no intact checkpoint to resume from: start over (damaged ones kept aside)


CheckpointForm = Literal["checkpoint_megatron", "checkpoint_hf"]


class OutputConfig(Section):
    dir: str
    type: CheckpointForm = "checkpoint_megatron"  # the form of the output artifact <dir>/policy


class RewardHackingConfig(Section):
    """Where a run says it sees reward hacking (rlsteps.engine.records.reward_hacking), in one line and at its end."""

    enabled: bool = True
    # entropy collapse and identical answers are said only once a validation function (validation.reward_functions)
    # stands below its best by more than max_validation_fall: a run that converged on what they reward is not hacking
    min_entropy_share: Probability = 0.2  # train/entropy below this share of the first step's: collapsing
    max_identical_groups: Probability = 0.5  # share of a step's prompts whose rollouts are one answer, word for word
    # val/<function> below its best by this share of its rise to that best (or of the best itself), while the
    # trained reward's val/reward_mean is higher than there
    max_validation_fall: NonNegativeFloat = 0.1
    # ... at this many validations in a row: one low validation is a dip that a learning run climbs out of (the tiny
    # world's rl/reinforce at seed 2 says a repeated word for one validation, then learns the task)
    validations_fallen: PositiveInt = 2
    first_steps: PositiveInt = 2  # the steps the figures below are measured against (their mean), and the recent ones
    # train/fraction_ended below this share of the first steps': rollouts run on to max_new_tokens (a length hack)
    min_ended_share: Probability = 0.5
    # train/response_length above this multiple of the first steps': answers growing (a length hack; the tiny
    # world's healthy runs grow theirs by up to about 1.5x as they learn to list more adjectives)
    max_length_growth: PositiveFloat = 2.0
    # train/repeated_word_share (rollouts saying a word again) above the first steps' by this much: a repeat hack
    max_repeated_word_rise: Probability = 0.3


class LoggingConfig(Section):
    tensorboard: bool = False  # TensorBoard events in <output.dir>/tensorboard (engine/records/trackers.py)
    wandb_project: str | None = None
    mlflow_experiment: str | None = None
    mlflow_tracking_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else MLflow's default (./mlflow.db)
    samples_per_step: NonNegativeInt = 4  # rollouts per step written to samples.jsonl (judge answers too); 0 = none
    reward_hacking: RewardHackingConfig = RewardHackingConfig()


class TinyWorldConfig(Section):
    seed: NonNegativeInt = 0


class NemoRlJobConfig(Section):
    """engine=nemo_rl: how the job runs NeMo-RL inside its container (rlsteps.engine.nemo_rl_stages)."""

    workdir: str = "/opt/nemo-rl"  # NeMo-RL's checkout in its container: the driver and converters run there
    python: str = "uv run python"  # what runs NeMo-RL's scripts, split like a shell would
    driver: str | None = None  # the training command; None: <python> examples/run_grpo.py (with NeMo-Gym for rlhf)
    export: str | None = None  # the command that writes a NeMo-RL checkpoint in HF form; None: NeMo-RL's converter
    policy_backend: Literal["dtensor", "megatron"] = "dtensor"  # policy.dtensor_cfg or policy.megatron_cfg
    gym_agent: str = "genrm_simple_agent"  # rl/rlhf: the NeMo-Gym agent each prompt row names (agent_ref)
    ray_port: Annotated[int, Field(ge=1024, le=65535)] = 6379  # the Ray head's GCS port
    nodes_timeout_s: PositiveFloat = 900  # how long the head waits for every node to join Ray


def _beside_training_problem(cfg: RecipeConfig) -> str | None:
    """What of `cfg` the embedded engine's rollouts beside training cannot run, with the fix; None when it can."""
    grpo = getattr(cfg, "grpo", None)
    checks = (
        (
            cfg.algorithm == "rs",
            "rejection sampling keeps the best rollouts of the policy now",
            "rollout.max_age_steps=0",
        ),
        (
            not cfg.train.truncated_importance_sampling,
            "a policy up to that many steps older drew them, which the importance weights correct for",
            "train.truncated_importance_sampling=true",
        ),
        (
            bool(grpo and grpo.dynamic_sampling),
            "dynamic sampling refills a step with rollouts of the policy now (NeMo-RL's asynchronous loop refuses it)",
            "grpo.dynamic_sampling=false",
        ),
    )
    return next((f"{why} (fix: {fix})" for failed, why, fix in checks if failed), None)


class RecipeConfig(RewardTerms, Section):
    algorithm: str
    # a rollout's reward: the weighted sum of these terms, each logged as reward/<name>; each recipe's schema gives
    # its default (the reward model for rs and reinforce, the judge for grpo)
    rewards: dict[str, RewardEntry | None]
    rm: RewardModelClientConfig = RewardModelClientConfig()
    judge: JudgeConfig = JudgeConfig()
    seed: NonNegativeInt = 1234
    # embedded: this package's own loop; nemo_rl: NeMo-RL's GRPO in its container (rl/rlhf, rl/reinforce)
    engine: Literal["embedded", "nemo_rl"] = "embedded"
    run: RunConfig = RunConfig()
    inputs: Inputs
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    train: TrainConfig = TrainConfig()
    validation: ValidationConfig = ValidationConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    output: OutputConfig
    logging: LoggingConfig = LoggingConfig()
    tiny_world: TinyWorldConfig | None = None

    @model_validator(mode="after")
    def _rollouts_beside_training(self) -> RecipeConfig:
        """rollout.max_age_steps > 0 on the embedded engine (engine.generation.beside); NeMo-RL's asynchronous GRPO
        is checked where it compiles (nemo_rl.asynchronous)."""
        age = self.rollout.max_age_steps
        if age and self.engine == "embedded":
            problem = _beside_training_problem(self)
            if problem:
                raise ValueError(f"rollout.max_age_steps={age} draws rollouts beside training; {problem}")
        return self

    @model_validator(mode="after")
    def _rewards_in_use(self) -> RecipeConfig:
        checked_rewards(self.rewards)
        if self.uses_reward("judge") and self.rollout.num_rollouts_per_prompt < 2:
            raise ValueError(
                "a judge compares a prompt's responses: rollout.num_rollouts_per_prompt must be 2 or more with a "
                "rewards entry of source judge"
            )
        return self


class NemoRlEngine(Section):
    """The keys of a recipe NeMo-RL can run: how the job runs it, and NeMo-RL's own keys passed through."""

    nemo_rl_reward: ClassVar[str]  # the one rewards source NeMo-RL's environment for the recipe gives

    @model_validator(mode="after")
    def _one_reward_on_nemo_rl(self) -> NemoRlEngine:
        terms = self.reward_terms  # type: ignore[attr-defined]
        if self.engine == "nemo_rl" and [(e.kind, e.weight) for e in terms.values()] != [(self.nemo_rl_reward, 1.0)]:  # type: ignore[attr-defined]
            source = self.nemo_rl_reward  # type: ignore[attr-defined]
            others = " ".join(f"rewards.{n}=null" for n, e in terms.items() if e.kind != source)
            keep = others or f"one {source} term of weight 1"
            raise ValueError(
                f"engine=nemo_rl gives this step's rewards from NeMo-RL's {source} environment alone; rewards "
                f"{', '.join(terms)} run on the embedded engine (fix: engine=embedded, or {keep})"
            )
        return self

    nemo_rl_job: NemoRlJobConfig = NemoRlJobConfig()
    # NeMo-RL master-config keys set as they are over the compiled ones (e.g. policy.dtensor_cfg.tensor_parallel_size)
    nemo_rl: dict[str, Any] = {}


class RSConfig(RecipeConfig):
    algorithm: Literal["rs"]
    rewards: dict[str, RewardEntry | None] = REWARD_MODEL_ONLY

    @model_validator(mode="after")
    def _needs_top_n(self) -> RSConfig:
        if self.engine != "embedded":
            raise ValueError(
                "engine: rl/rs runs on the embedded engine only (NeMo-RL has no rejection-sampling recipe)"
            )
        if self.rollout.top_n_rollouts is None:
            raise ValueError("rollout.top_n_rollouts is required for rejection sampling")
        if self.train.truncated_importance_sampling:
            raise ValueError(
                "train.truncated_importance_sampling is for policy-gradient losses; rejection sampling fine-tunes on "
                "the kept rollouts, with no sampler probability in its loss"
            )
        return self


class ReinforceSection(Section):
    initial_policy_kl_penalty: NonNegativeFloat = 0.01
    use_absolute_kl: bool = True


class ReinforceConfig(NemoRlEngine, RecipeConfig):
    nemo_rl_reward: ClassVar[str] = "reward_model"
    algorithm: Literal["reinforce"]
    rewards: dict[str, RewardEntry | None] = REWARD_MODEL_ONLY
    reinforce: ReinforceSection = ReinforceSection()


class GRPOSection(Section):
    leave_one_out: bool = False
    normalize_std: bool = True
    std_floor: NonNegativeFloat = 1e-3
    eps_low: Probability = 0.2
    eps_high: NonNegativeFloat = 0.2
    kl_beta: NonNegativeFloat = 0.01
    dynamic_sampling: bool = False
    dynamic_sampling_max_gen_batches: PositiveInt = 10  # a step's generation batches past which dynamic sampling stops
    overlong_filtering: bool = False


class GRPOConfig(NemoRlEngine, RecipeConfig):
    nemo_rl_reward: ClassVar[str] = "judge"
    algorithm: Literal["grpo"]
    rewards: dict[str, RewardEntry | None] = JUDGE_ONLY
    grpo: GRPOSection = GRPOSection()


NEMO_RL_SECTIONS = ("grpo", "loss_fn", "policy", "data", "env", "checkpointing", "logger", "cluster")


class NemoRlGrpoConfig(Section):
    """rl/nemo_rl/rlhf: NeMo-RL's master config (its sections, any key NeMo-RL's schema has; NeMo-RL validates the
    values) and rlsteps's keys around it. `inputs` and `nemo_rl_job.policy_backend` are derived from NeMo-RL's keys
    for the job's stages, and the keys checked against NeMo-RL's schema, where the step is compiled
    (rlsteps.nemo_rl.key_map.with_derived_keys, rlsteps.nemo_rl.schema.unknown_keys_problem)."""

    model_config = ConfigDict(extra="allow", frozen=True)  # NeMo-RL's MasterConfig takes further top-level keys
    algorithm: Literal["nemo_rl_grpo"]
    # auto: NeMo-RL on a Slurm or Lepton profile, the embedded engine here; nemo_rl | embedded: as named
    engine: Literal["auto", "nemo_rl", "embedded"] = "auto"
    embedded_config: str = "default"  # the rl/rlhf config the embedded engine starts from
    nemo_rl_job: NemoRlJobConfig = NemoRlJobConfig()
    output: OutputConfig
    tiny_world: TinyWorldConfig | None = None
    inputs: dict[str, Any] = {}
    grpo: dict[str, Any]
    loss_fn: dict[str, Any]
    policy: dict[str, Any]
    data: dict[str, Any]
    env: dict[str, Any]
    checkpointing: dict[str, Any]
    logger: dict[str, Any]
    cluster: dict[str, Any]


RECIPE_SCHEMAS: dict[str, type[RecipeConfig]] = {
    "rs": RSConfig,
    "reinforce": ReinforceConfig,
    "grpo": GRPOConfig,
}


class ConvertInputs(Section):
    checkpoint: str


class ConvertRunConfig(Section):
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: the dtype the source checkpoint stores
    num_threads: PositiveInt | None = None


class ConvertConfig(Section):
    """A checkpoint converted between its Hugging Face and Megatron forms, weights unchanged."""

    algorithm: Literal["convert"]
    seed: NonNegativeInt = 0
    run: ConvertRunConfig = ConvertRunConfig()
    inputs: ConvertInputs
    output: OutputConfig
    tiny_world: TinyWorldConfig | None = None


STEP_SCHEMAS: dict[str, type[Section]] = {**RECIPE_SCHEMAS, "nemo_rl_grpo": NemoRlGrpoConfig, "convert": ConvertConfig}
