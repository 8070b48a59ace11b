"""The NeMo-RL job's own stages, run by its node script (rlsteps.launch.ray_job):

    python -m rlsteps.engine.nemo_rl_stages prepare JOB_DIR/config.yaml
    python -m rlsteps.engine.nemo_rl_stages finish JOB_DIR/config.yaml
    python -m rlsteps.engine.nemo_rl_stages await-ray --address HOST:PORT --nodes N --publish FILE --timeout S
    python -m rlsteps.engine.nemo_rl_stages stop-stale-ray --root RUN_DIR/nemo_rl/ray \
        --state RUN_DIR/nemo_rl/ray/ATTEMPT

Exit codes as the worker's: 0 done, 3 an input is missing or unusable, 1 anything else, each with one line that
says why. Only the standard library is imported before the stage runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

log = logging.getLogger("rlsteps")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlsteps.engine.nemo_rl_stages", description=__doc__.splitlines()[0]
    )
    stages = parser.add_subparsers(dest="stage", required=True)
    for name, what in (("prepare", "the inputs in NeMo-RL's forms"), ("finish", "NeMo-RL's checkpoint as the output")):
        stages.add_parser(name, help=what).add_argument("config", type=Path, help="the job's compiled config.yaml")
    ray = stages.add_parser("await-ray", help="wait until every node has joined the head's Ray")
    ray.add_argument("--address", required=True)
    ray.add_argument("--nodes", type=int, required=True)
    ray.add_argument("--publish", type=Path, required=True, help="where the head's address is written once it answers")
    ray.add_argument("--timeout", type=float, required=True)
    stale = stages.add_parser("stop-stale-ray", help="stop the Ray processes an earlier try left on this node")
    stale.add_argument("--root", type=Path, required=True, help="the folder of the run's attempts")
    stale.add_argument("--state", type=Path, required=True, help="this attempt's state folder")
    return parser


def run(args: argparse.Namespace) -> None:
    if args.stage == "await-ray":
        from rlsteps.engine.nemo_rl_stages.ray_nodes import await_ray

        await_ray(args.address, args.nodes, args.publish, args.timeout)
        return
    if args.stage == "stop-stale-ray":
        from rlsteps.engine.nemo_rl_stages.ray_nodes import stop_stale

        stop_stale(args.root, args.state)
        return
    from rlsteps.engine.run import preflight

    unable = preflight.problem(preflight.CHECKPOINT_NEEDS)
    if unable:
        raise RuntimeError(unable)
    from rlsteps.contract.worker_args import load_config
    from rlsteps.engine.nemo_rl_stages import stages
    from rlsteps.engine.records.output import job_record

    cfg = load_config(args.config)
    job = job_record(args.config)
    if args.stage == "prepare":
        stages.prepare(cfg, job)
    else:
        stages.finish(cfg, job)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s [{args.stage}] %(message)s", stream=sys.stderr)
    from rlsteps.contract.input_check import EXIT_INPUT, InputProblem
    from rlsteps.contract.prompts import PromptFileError

    try:
        run(args)
    except (InputProblem, PromptFileError) as problem:
        log.error("%s", problem)
        return EXIT_INPUT
    except (ValueError, RuntimeError, OSError, ImportError) as error:  # one line: what, not a traceback
        log.error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
