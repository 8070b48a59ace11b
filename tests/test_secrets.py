from rlsteps.secrets import MASK, env_name, is_secret_key, mask, mask_argv, secret_paths


def test_secret_words_not_substrings():
    for key in ("token", "rm.token", "api_key", "WANDB_API_KEY", "HF_TOKEN", "db_password", "client-secret"):
        assert is_secret_key(key), key
    for key in ("max_new_tokens", "keep_top_k", "monkey", "tokenizer", "keys_total"):
        assert not is_secret_key(key), key


def test_mask_nested_and_argv():
    data = {"rm": {"token": "abc", "url": "u"}, "env_vars": {"HF_TOKEN": "x", "A": "b"}, "empty_key": None}
    assert mask(data) == {
        "rm": {"token": MASK, "url": "u"},
        "env_vars": {"HF_TOKEN": MASK, "A": "b"},
        "empty_key": None,
    }
    assert mask_argv(["rm.token=abc", "+judge.api_key=k", "train.lr=1", "run"]) == [
        f"rm.token={MASK}",
        f"+judge.api_key={MASK}",
        "train.lr=1",
        "run",
    ]


def test_secret_paths_and_env_names():
    assert secret_paths({"judge": {"api_key": "k", "url": None}, "rm": {"token": ""}}) == {"judge.api_key": "k"}
    assert env_name("judge.api_key") == "RLSTEPS_SECRET_JUDGE_API_KEY"


def test_mask_argv_masks_the_word_after_a_secret_flag():
    assert mask_argv(["--hf-token", "abc", "--log-level", "debug", "--api-key=k", "x"]) == [
        "--hf-token",
        MASK,
        "--log-level",
        "debug",
        f"--api-key={MASK}",
        "x",
    ]
