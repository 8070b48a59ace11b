"""Faults users found in the served models and in Slurm jobs, each on the real thing.

- The reward and judge servers, started as a run starts them (LocalServer, the token in an environment variable):
  without the token only a bare liveness probe answers; a 422 names the field and repeats nothing that was sent.
- A URL's password never reaches a dry run, an error message or a job file.
- #SBATCH values reach sbatch intact: a job dir with a space, quotes and a % gets its log where rlsteps reads it;
  one Slurm cannot take (a backslash) is refused before anything is submitted.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from model_fixtures import save_reward_model
from rlsteps.engine.rewards.judge.protocol import judge_messages
from rlsteps.engine.rewards.process import LocalServer
from rlsteps.engine.rewards.rm.client import RewardClient
from rlsteps.launch.base import JobState
from rlsteps.plan import submitted_jobs as jobs
from run_helpers import rlsteps
from test_launch_slurm import PROFILES, TINY_RUN, ended, needs_cluster, submitted_record, wait_until

# Slow (starts real reward and judge servers, and sbatch stand-ins): the fast tier, -m 'not slow', leaves it out
pytestmark = pytest.mark.slow

TOKEN = "tok-8c1f2e"
TOKEN_ENV = "FAULTS_TEST_TOKEN"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PASSWORD = "pw-5e3d9a"
URL = f"http://alice:{PASSWORD}@127.0.0.1:9"
MASKED_URL = "http://alice:******@127.0.0.1:9"
GUARDED = ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect", "/no/such/path", "/v1/models"]


def process_gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


@contextlib.contextmanager
def started(module: str, model: Path, tmp: Path, *args: str) -> Iterator[tuple[LocalServer, int]]:
    """The server as a run starts it, the token passed the way a run passes it; yields it and its pid."""
    server = LocalServer(
        module,
        ["--model", str(model), *args, "--device", "cpu", "--token-env", TOKEN_ENV],
        log_path=tmp / f"{module}.log",
        env={TOKEN_ENV: TOKEN},
        startup_timeout_s=120,
    )
    with server:  # returns once its readiness poll (GET /health, no token) answered 200
        yield server, server.process.pid


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_reward_model(tmp_path_factory.mktemp("faults_reward_model"))


@pytest.mark.parametrize("module", ["rlsteps.engine.rewards.rm", "rlsteps.engine.rewards.judge"])
def test_with_a_token_only_a_bare_liveness_probe_answers_without_it(module, model, tmp_path):
    with started(module, model, tmp_path) as (server, pid):
        url = server.url
        bare = httpx.get(f"{url}/health")
        full = httpx.get(f"{url}/health", headers=AUTH)
        refused = {path: httpx.get(url + path) for path in GUARDED}
        refused_post = httpx.post(f"{url}/v1/rewards" if module.endswith("rm") else f"{url}/v1/chat/completions")
        docs_with_token = {path: httpx.get(url + path, headers=AUTH).status_code for path in GUARDED[:3]}
        if module.endswith("rm"):
            with RewardClient(url, token=TOKEN) as client:  # what a run's client asks
                told = client.health()
        else:
            body = {"model": "judge", "messages": judge_messages([{"role": "user", "content": "a?"}], " b", " c", None)}
            judged = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
            told = full.json()
    assert process_gone(pid)
    assert bare.status_code == 200 and bare.json() == {"status": "ok"}, bare.text
    assert str(model) not in bare.text and "model" not in bare.text
    assert full.status_code == 200 and full.json()["model"] and told["status"] == "ok"
    if module.endswith("rm"):
        assert told["model"] == str(model) and "queue" in told
    else:
        assert judged.status_code == 200, judged.text
    for path, answer in refused.items():
        assert answer.status_code == 401, (path, answer.status_code, answer.text)
        assert "bearer token" in answer.text and str(model) not in answer.text and "openapi" not in answer.text
    assert refused_post.status_code == 401
    assert docs_with_token == {"/docs": 404, "/redoc": 404, "/openapi.json": 404}  # off: a browser has no token


SENT = "sent-5f0c2a"  # in every value and key a request sends: an answer holding it repeats what was sent


def test_a_422_names_the_field_and_repeats_nothing_that_was_sent(model, tmp_path):
    long_text = SENT * 10_000
    with started("rlsteps.engine.rewards.rm", model, tmp_path) as (server, pid):
        rewards = f"{server.url}/v1/rewards"
        post = functools.partial(httpx.post, rewards, headers=AUTH)
        answers = {
            "responses.0": post(json={"prompts": [long_text], "responses": [7]}),
            "(a key the server does not know)": post(json={"tokens": [[1]], SENT * 500: long_text}),
            "(a key the server does not know; did you mean 'prompts'?)": post(json={"tokens": [[1]], "prompt": SENT}),
            "truncation_side": post(json={"tokens": [[1]], "truncation_side": SENT}),
            "(the body)": post(content=b"{" + long_text.encode()),
            "tokens": post(json={"tokens": [[1, 5_000_000, 7_000_001]]}),  # ids outside the vocabulary
        }
    assert process_gone(pid)
    for field, answer in answers.items():
        assert answer.status_code == 422, (field, answer.text)
        assert SENT not in answer.text and "5000000" not in answer.text, answer.text[:600]
        assert len(answer.content) < 1500, answer.text[:300]
        if field != "tokens":  # refused by the schema: the field named
            assert field in answer.json()["fields"].split(", "), answer.json()
    assert answers["responses.0"].json()["detail"][0]["msg"] == "Input should be a valid string"
    assert answers["responses.0"].json()["detail"][0]["input"] == "a int"
    assert answers["truncation_side"].json()["detail"][0]["input"] == f"a string of {len(SENT)} characters"
    assert "has 2 ids outside the reward model's vocabulary" in answers["tokens"].json()["detail"]


def test_a_urls_password_is_masked_in_a_dry_run_and_an_error(tmp_path):
    (tmp_path / "rlsteps.yaml").write_text(PROFILES.format(shared=tmp_path / "shared"))
    dry = rlsteps("run", "rs", *TINY_RUN, f"rm.url={URL}", "-b", "ci", "--dry-run", cwd=tmp_path, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert PASSWORD not in dry.stdout + dry.stderr and MASKED_URL in dry.stdout
    assert "#SBATCH --output=" in dry.stdout
    bad = rlsteps("run", "rs", *TINY_RUN, URL, cwd=tmp_path, timeout=120)  # not key=value: the error quotes it
    assert bad.returncode == 2
    assert PASSWORD not in bad.stdout + bad.stderr and f"error: unexpected argument '{MASKED_URL}'" in bad.stderr
    assert not (tmp_path / ".rlsteps").exists() or not any((tmp_path / ".rlsteps").rglob("*.json"))


@needs_cluster
def test_a_job_dir_with_a_space_quotes_and_a_percent_gets_its_log_where_rlsteps_reads_it(tiny_world, tmp_path):
    """The URL's password goes to the job through the environment: no job file holds it."""
    cwd = tmp_path / 'it\'s a "job" dir 100%x'
    cwd.mkdir()
    (cwd / "rlsteps.yaml").write_text(PROFILES.format(shared=tmp_path / "shared"))
    done = rlsteps("run", "rs", *TINY_RUN, f"rm.url={URL}", "-b", "ci", "--", "--help", cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    record = submitted_record(cwd)
    wait_until(record, ended(record), timeout=120)
    assert jobs.job_status(record).state is JobState.SUCCEEDED
    job_dir = Path(record.job_dir)
    assert job_dir.parent == cwd / ".rlsteps" / "jobs"
    log = job_dir / f"slurm-{record.job_id}.log"
    assert log.is_file(), sorted(str(p) for p in tmp_path.rglob("slurm-*.log"))
    assert "usage: python -m rlsteps.engine.run.worker" in log.read_text()
    shown = subprocess.run(["scontrol", "show", "job", record.job_id], capture_output=True, text=True).stdout
    assert f"WorkDir={cwd}" in shown or not shown  # scontrol forgets a job MinJobAge after it ends
    assert "${oc.env:RLSTEPS_SECRET_RM_URL}" in (job_dir / "config.yaml").read_text()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
    queued = subprocess.run(["squeue", "--noheader", "--jobs", record.job_id], capture_output=True, text=True)
    assert record.job_id not in queued.stdout


def test_a_job_dir_slurm_cannot_log_to_is_refused_before_anything_is_submitted(tmp_path):
    cwd = tmp_path / "back\\slash"
    cwd.mkdir()
    (cwd / "rlsteps.yaml").write_text(PROFILES.format(shared=tmp_path / "shared"))
    refused = rlsteps("run", "rs", *TINY_RUN, "-b", "ci", cwd=cwd, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    error, *fix = refused.stderr.strip().splitlines()
    assert error.startswith("error: the job dir ") and "has a backslash, which Slurm drops" in error
    assert fix and fix[0].startswith("fix: use a job dir without one")
    assert not (cwd / ".rlsteps" / "jobs").exists() or not any((cwd / ".rlsteps" / "jobs").iterdir())
    if shutil.which("squeue"):
        mine = subprocess.run(["squeue", "--noheader", "--format=%Z"], capture_output=True, text=True).stdout
        assert str(cwd) not in mine
