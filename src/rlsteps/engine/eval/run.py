"""eval/policy end to end: the policy's (and the baseline's) responses generated and scored prompt batch by prompt
batch, the judge's verdicts on the two, then the report: <output.dir>/report (report.json, report.md, report.png),
an eval_report artifact written whole or not at all.

Each phase appends its finished prompts to results/<phase>.jsonl (rlsteps.engine.eval.results), so a rerun after a
kill goes on where it stopped; a rerun of a finished eval with the same config and inputs does nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlsteps.contract.artifact import config_hash, read_artifact_metadata, write_artifact
from rlsteps.contract.eval_config import REPORT_NAME, EvalConfig
from rlsteps.contract.input_check import InputProblem
from rlsteps.contract.prompts import Prompt, PromptFileError, load_prompts, prompt_options
from rlsteps.engine.distributed import World
from rlsteps.engine.eval.generate import generate_phase, in_batches, response_terms
from rlsteps.engine.eval.judging import judge_prompts
from rlsteps.engine.eval.markdown import report_markdown
from rlsteps.engine.eval.report import build_report
from rlsteps.engine.eval.results import append_results, claim_for_config, done_ids, read_results, results_path
from rlsteps.engine.rewards.combined import CombinedSource, open_reward_source

log = logging.getLogger("rlsteps")
REPORT_TYPE = "eval_report"


def run_eval(cfg: EvalConfig, run_dir: Path, world: World, job: dict[str, Any], versions: dict[str, str]) -> int:
    """Evaluate, resuming from the results on disk; write the report. The exit code."""
    if world.size > 1:
        raise ValueError(f"eval/policy runs in one process, not {world.size}: run it with one process")
    digest = config_hash(cfg.model_dump(mode="json"))
    written = read_artifact_metadata(run_dir / REPORT_NAME) or {}
    if written.get("config_hash") == digest and written.get("input_versions") == versions:
        log.info("already done: %s holds the report of this config and these inputs", run_dir / REPORT_NAME)
        return 0
    claim_for_config(run_dir, digest)
    with open_reward_source(cfg, run_dir) as scorer:
        policy = _phase(cfg, "policy", cfg.inputs.policy, scorer, run_dir, world)
        baseline = _phase(cfg, "baseline", cfg.inputs.baseline, scorer, run_dir, world) if cfg.inputs.baseline else None
        judged = _judge_phase(cfg, scorer, policy, baseline, run_dir) if cfg.uses_reward("judge") else None
    terms = [term.name for term in response_terms(scorer)]
    report = build_report(cfg, policy, baseline, judged, terms)
    target = _write_report(cfg, report, run_dir, job, versions, digest)
    log.info("eval report (%s): %s\n%s", REPORT_TYPE, target, (target / "report.md").read_text())
    return 0


def eval_prompts(cfg: EvalConfig, policy_path: str) -> list[Prompt]:
    """The prompts, rendered with this policy's tokenizer: the first eval.num_prompts, ids unique."""
    from rlsteps.engine.policy.model import load_policy_tokenizer

    tokenizer = load_policy_tokenizer(policy_path)
    try:
        options = prompt_options(cfg.data.model_dump(), "prompts")
        prompts = load_prompts(cfg.inputs.prompts, tokenizer, cfg.data.max_prompt_tokens, log.info, options)
    except PromptFileError as error:
        raise InputProblem(f"input 'prompts': {error}") from None
    prompts = prompts[: cfg.eval.num_prompts]
    seen: set[str] = set()
    for prompt in prompts:
        if prompt.id in seen:
            raise InputProblem(
                f"input 'prompts': the id {prompt.id!r} is on two prompts; an eval keeps its results by prompt id: "
                "give each prompt its own id, or none (the line number is the id then)"
            )
        seen.add(prompt.id)
    return prompts


def _phase(
    cfg: EvalConfig, phase: str, path: str, scorer: CombinedSource, run_dir: Path, world: World
) -> list[dict[str, Any]]:
    """One policy's records, every prompt's: those on disk, and the rest generated now."""
    prompts = eval_prompts(cfg, path)
    out = results_path(run_dir, phase)
    records = read_results(out)
    done = done_ids(records)
    todo = [i for i, prompt in enumerate(prompts) if prompt.id not in done]
    log.info("%s (%s): %d of %d prompts to do", phase, path, len(todo), len(prompts))
    fresh: list[dict[str, Any]] = []
    generate_phase(cfg, path, prompts, todo, scorer, _writer(out, fresh, phase, len(prompts)), run_dir, world)
    return _in_prompt_order(prompts, records + fresh)


def _writer(out: Path, kept: list[dict[str, Any]], phase: str, total: int) -> Callable[[list[dict[str, Any]]], None]:
    def write(records: list[dict[str, Any]]) -> None:
        append_results(out, records)
        kept.extend(records)
        log.info("%s: %d prompts done (%s)", phase, len(read_results(out)), f"of {total}")

    return write


def _judge_phase(
    cfg: EvalConfig, scorer: CombinedSource, policy: list[dict], baseline: list[dict], run_dir: Path
) -> list[dict[str, Any]]:
    judge = next(term.source for term in scorer.terms if cfg.reward_terms[term.name].kind == "judge")
    prompts = eval_prompts(cfg, cfg.inputs.policy)
    out = results_path(run_dir, "judge")
    records = read_results(out)
    done = done_ids(records)
    todo = [i for i, prompt in enumerate(prompts) if prompt.id not in done]
    log.info("judge: %d of %d prompts to compare", len(todo), len(prompts))
    for batch in in_batches(todo, cfg.eval.batch_prompts):
        judged = judge_prompts(
            judge, [prompts[i] for i in batch], [policy[i] for i in batch], [baseline[i] for i in batch]
        )
        append_results(out, judged)
        records += judged
    return _in_prompt_order(prompts, records)


def _in_prompt_order(prompts: list[Prompt], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_id = {record["id"]: record for record in records}
    return [by_id[prompt.id] for prompt in prompts]


def _write_report(
    cfg: EvalConfig, report: dict[str, Any], run_dir: Path, job: dict[str, Any], versions: dict[str, str], digest: str
) -> Path:
    from rlsteps.engine.eval.plot import plot_report
    from rlsteps.install import source, version

    def contents(folder: Path) -> None:
        (folder / "report.json").write_text(json.dumps(report, indent=2, allow_nan=True) + "\n")
        (folder / "report.md").write_text(report_markdown(report))
        plot_report(report, folder / "report.png")

    metadata = {
        "type": REPORT_TYPE,
        "producer": {
            "step": job.get("job", {}).get("step"),
            "job": job.get("job", {}).get("name"),
            "algorithm": cfg.algorithm,
            "rlsteps": {"version": version(), "source": source()},
        },
        "config_hash": digest,
        "inputs": {name: ref for name, ref in cfg.inputs.model_dump().items() if ref},
        "input_versions": versions,
        "counters": {"prompts": report["prompts"]},
    }
    return write_artifact(run_dir / REPORT_NAME, contents, metadata)
