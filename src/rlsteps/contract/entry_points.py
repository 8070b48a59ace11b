"""The programs the submitting side starts by module name, and the exit codes it reads back from them: defined once,
here, so a launcher and the program it starts cannot drift apart (tests/test_layout.py imports each one). Standard
library only."""

from __future__ import annotations

WORKER_MODULE = "rlsteps.engine.run.worker"  # one step's run: `python -m WORKER_MODULE JOB_DIR/config.yaml`
NEMO_RL_STAGES_MODULE = "rlsteps.engine.nemo_rl_stages"  # what a NeMo-RL job runs around NeMo-RL's driver
SERVER_MODULES = {"rm": "rlsteps.engine.rewards.rm", "judge": "rlsteps.engine.rewards.judge"}  # `rlsteps serve`

EXIT_CHECKPOINTED = 75  # EX_TEMPFAIL: the worker stopped on request after a checkpoint; run again to go on
