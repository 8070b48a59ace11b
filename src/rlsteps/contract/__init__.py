"""The contract between submitting a job and running it: what the command line, the planner, the launchers and the
artifact store (cli, plan, launch, artifacts) share with the worker, and all of the engine they import (the `serve`
commands' entry aside). Torch-free: `rlsteps list`, a dry run and a submission import none of the engine's weight.

  config: the config schemas of every step (what a compiled config.yaml holds)
  worker_args: the worker's command line and how it reads its config.yaml
  run_files: what a run leaves in its run directory and beside its exit code, by name (checkpoints, metrics, the
    failure's cause, the worker's terminal log) and the environment the local launcher hands the worker
  run_lock: one run per run directory (the lock file, who holds it, exit code 2)
  output_dir: whether output.dir can hold a run (a file there, another run's output, room on the disk)
  disk: room on a disk, a full disk said in one line, what a checkpoint will take
  world_check: what a process count needs of a config
  input_check, detect, weight_files, prompts, prompt_tokenizer: the inputs a step reads, checked where the job is
    compiled and again where it runs (a missing, mistyped or damaged input; a bad prompt line; prompt lengths)
  megatron_files: a checkpoint_megatron's names and where its torch_dist folder lies
  artifact: an artifact's metadata (rlsteps_artifact.json), fingerprints and the config hash
  nemo_rl_job: what a NeMo-RL job's compile and its stages agree on (its files, its optimizer steps per step)
"""
