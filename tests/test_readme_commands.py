"""README.md's test command installs the pinned set (tests/test_layout.py holds CI to the command itself)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_the_test_environments_install_the_pinned_set():
    """CI installs the versions in constraints.txt (constraints-vllm.txt and constraints-triton.txt for the vLLM and
    PyTriton environments): a release
    made since changes nothing until the pins are rewritten (tests/freeze_constraints.sh)."""
    tests_command = next(c for c in readme_commands() if "pytest" in c)
    assert "pip install -q -c constraints.txt -e '.[engine,megatron,lepton,test]'" in tests_command
    assert "-c constraints-vllm.txt" in (ROOT / "tests" / "make_vllm_env.sh").read_text()
    assert "-c constraints-triton.txt" in (ROOT / "tests" / "make_triton_env.sh").read_text()
    for name in ("constraints.txt", "constraints-vllm.txt", "constraints-triton.txt"):
        pins = [line for line in (ROOT / name).read_text().splitlines() if line and not line.startswith("#")]
        assert pins and all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[^\s=]+", line) for line in pins), name
        assert not any(line.lower().startswith(("torch==", "rlsteps")) for line in pins), name
