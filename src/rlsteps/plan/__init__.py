"""From a step, a config and a profile to a frozen Job, its job directory and its submission.

catalog lookups, compile (config chain, profile overlay, overrides, schema), profiles, resolvers, job_dir
(provenance), runner (run one step), pipeline (run steps chained by their artifacts), submitted_jobs (find
submitted jobs again). Torch-free: a dry run never imports the engine.
"""
