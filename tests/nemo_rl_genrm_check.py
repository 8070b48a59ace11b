"""What NeMo-Gym's genrm_compare makes of a judge that cannot take the request (a prompt and two answers longer
than its max_model_len), from Gym's own code, on a CPU:

    python tests/nemo_rl_genrm_check.py MAX_MODEL_LEN REQUESTED

genrm_compare's server (the pinned Gym's resources_servers/genrm_compare/app.py) compares a group of four answers;
only its client to the judge is stood in, answering every request as the judge's server answers one over its
context: vLLM's error ("This model's maximum context length is ..."). It also runs NeMo-RL's GRPO baseline on the
rewards Gym returns. Prints {"rewards": [...], "advantages": [...]} as JSON. Run it as a process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
from pathlib import Path
from unittest.mock import AsyncMock, MagicMock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import nemo_rl_oracle  # noqa: E402
import upstream  # noqa: E402


def judge_over_its_context(max_model_len: int, requested: int) -> MagicMock:
    """The genrm_model server's reply to a request longer than the judge's context: vLLM's error, passed on."""
    error = {
        "object": "error",
        "type": "BadRequestError",
        "code": 400,
        "message": f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{requested} tokens. Please reduce the length of the messages or completion.",
    }
    reply = AsyncMock()
    reply.json = AsyncMock(return_value=error)
    client = MagicMock()
    client.post = AsyncMock(return_value=reply)
    return client


def main() -> int:
    max_model_len, requested = map(int, sys.argv[1:3])
    nemo_rl_oracle.gym_deps_on_path()
    sys.modules["torch.utils.tensorboard"] = upstream.inert_module("torch.utils.tensorboard")  # not installed here
    with contextlib.redirect_stdout(io.StringIO()), upstream.nemo_rl_importable(stub=upstream.HEAVY - {"torch"}):
        import torch
        from nemo_gym.config_types import ModelServerRef
        from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
        from nemo_rl.algorithms.utils import calculate_baseline_and_std_per_prompt
        from resources_servers.genrm_compare.app import (
            GenRMCompareConfig,
            GenRMCompareRequest,
            GenRMCompareResourcesServer,
        )

        config = GenRMCompareConfig(
            host="localhost", port=8000, entrypoint="app.py", domain="rlhf", name="genrm_compare",
            genrm_model_server=ModelServerRef(type="responses_api_models", name="genrm_model"),
            genrm_responses_create_params=NeMoGymResponseCreateParamsNonStreaming(input=[], max_output_tokens=256),
            num_rollouts_per_prompt=4, genrm_parse_retry_sleep_s=0.0,
        )  # fmt: skip
        client = judge_over_its_context(max_model_len, requested)
        server = GenRMCompareResourcesServer.model_construct(config=config, server_client=client)
        answers = [{"output": [{"type": "message", "content": [{"type": "output_text", "text": f"answer {n}"}]}]}
                   for n in range(4)]  # fmt: skip
        request = GenRMCompareRequest(conversation_history=[{"role": "user", "content": "a prompt"}],
                                      response_objs=answers)  # fmt: skip
        rewards = asyncio.run(server.compare(request)).rewards
        reward_tensor = torch.tensor(rewards)
        baseline, _ = calculate_baseline_and_std_per_prompt(
            torch.zeros(4, 1, dtype=torch.long), reward_tensor, torch.ones(4), leave_one_out_baseline=False
        )
        advantages = (reward_tensor - baseline).tolist()
        said = {"rewards": rewards, "advantages": advantages, "judge_calls": client.post.await_count}
    print(json.dumps(said))
    return 0


if __name__ == "__main__":
    sys.exit(main())
