"""Train a tiny generative judge, a Llama that reads the two responses of rlsteps' judge prompt, and write it as a
Hugging Face folder that vLLM serves.

    python tests/tiny_generative_judge.py OUT_DIR TOKENIZER_DIR
        (with the interpreter of the vLLM environment, .venv-vllm: tests/make_vllm_env.sh; TOKENIZER_DIR is
         SmolLM2-135M-Instruct's folder, whose tokenizer and chat template the judge uses)

The judge is a 2-layer Llama of about 235k parameters with SmolLM2's tokenizer cut down to the tokens it needs
(its embeddings start from SmolLM2's, projected). It is trained offline and deterministically (the same bytes on
every build on one kind of CPU, a minute or two on 2 cores; CPUs with other vector units round differently, so what
holds everywhere is the check below, not the bytes) on prompts built by rlsteps' own judge_messages(): a question
with one response that answers it and one that is nonsense, in either order, each example seen twice. It answers
with the judgement the protocol asks for, the answer scored 5 and the nonsense 1:

    {"score_1": 5, "score_2": 1, "ranking": 1}    (the answer is response 1)
    {"score_1": 1, "score_2": 5, "ranking": 6}    (the answer is response 2)

A judge that must read both responses to answer: it has no position bias to fall back on, so whichever order a
pair comes in, its scores follow the responses. Which response is "response 1" is read from the prompt's text
(the one that comes first), never from the order the responses were passed in: a judge_messages() that put them
in the wrong sections could not teach the judge its own mistake.

The folder is checked before it is written: greedy decoding of pairs held out of training (the tests' pair
among them) must give the expected judgement in both orders. OUT_DIR appears whole or not at all.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from rlsteps.engine.rewards.judge.protocol import judge_messages

SEED = 0
ANSWER_FIRST = '{"score_1": 5, "score_2": 1, "ranking": 1}'
ANSWER_SECOND = '{"score_1": 1, "score_2": 5, "ranking": 6}'
EXAMPLES = 4000  # few, for a model of 235k parameters: a judge that cannot learn them by heart must learn to judge
EPOCHS = 2  # one left the held-out judgements to the rounding of the machine's float kernels (AVX2 against AVX-512)
DECISIVE_WEIGHT = 4.0
EMBEDDING_STD = 0.05
# The pair the tests send: held out of training, so the judge is tried on a pair it has never seen
HELD_OUT = ("What is the capital of France?", "The capital of France is Paris.", "asdf qwerty zxcv")

CAPITALS = {
    "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon", "Japan": "Tokyo",
    "Egypt": "Cairo", "Kenya": "Nairobi", "Peru": "Lima", "Canada": "Ottawa", "Norway": "Oslo",
    "Sweden": "Stockholm", "Greece": "Athens", "Poland": "Warsaw", "Austria": "Vienna", "Ireland": "Dublin",
    "Chile": "Santiago", "Cuba": "Havana", "Russia": "Moscow", "China": "Beijing", "India": "New Delhi",
    "Belgium": "Brussels", "Finland": "Helsinki", "Denmark": "Copenhagen", "Hungary": "Budapest",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "Mexico": "Mexico City", "Argentina": "Buenos Aires",
    "Turkey": "Ankara", "Iran": "Tehran", "Nigeria": "Abuja", "Morocco": "Rabat", "Australia": "Canberra",
}  # fmt: skip
COLOURS = {"the sky": "blue", "grass": "green", "snow": "white", "coal": "black", "a lemon": "yellow",
           "a tomato": "red", "an orange": "orange", "chocolate": "brown"}  # fmt: skip
ANIMALS = {"a dog": "barks", "a cat": "meows", "a cow": "moos", "a duck": "quacks", "a lion": "roars",
           "a sheep": "bleats", "a horse": "neighs", "a snake": "hisses"}  # fmt: skip


def question(rng: random.Random) -> tuple[str, str]:
    """A question and an answer to it: a capital, a sum, a product, a colour or an animal's sound."""
    kind = rng.randrange(5)
    if kind == 0:
        country, city = rng.choice(sorted(CAPITALS.items()))
        return rng.choice(
            [
                (f"What is the capital of {country}?", f"The capital of {country} is {city}."),
                (f"Which city is the capital of {country}?", f"{city} is the capital of {country}."),
                (f"Name the capital of {country}.", f"The capital city of {country} is {city}."),
                (f"What is the capital of {country}?", f"{city}."),
            ]
        )
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    if kind == 1:
        return rng.choice(
            [(f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."), (f"What is {a} + {b}?", f"{a + b}")]
        )
    if kind == 2:
        return rng.choice(
            [(f"What is {a} times {b}?", f"{a} times {b} is {a * b}."), (f"What is {a} * {b}?", f"{a * b}")]
        )
    if kind == 3:
        thing, colour = rng.choice(sorted(COLOURS.items()))
        return f"What colour is {thing}?", f"{thing[0].upper()}{thing[1:]} is {colour}."
    animal, sound = rng.choice(sorted(ANIMALS.items()))
    return f"What sound does {animal} make?", f"{animal[0].upper()}{animal[1:]} {sound}."


def nonsense(rng: random.Random) -> str:
    """Words of random letters, or of keys struck along the keyboard's rows."""
    rows = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
    words = []
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.5:
            row = rng.choice(rows)
            start = rng.randrange(len(row) - 2)
            words.append(row[start : start + rng.randint(2, len(row) - start)])
        else:
            words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))))
    return " ".join(words)


def first_is_response_1(messages: list[dict], first: str, second: str) -> bool:
    """Whether `first` comes before `second` in the judge prompt's text: the order the judge reads them in."""
    text = messages[-1]["content"]
    return text.index(f"\n{first}\n") < text.index(f"\n{second}\n")


def request(question: str, good: str, bad: str, good_first: bool) -> tuple[list[dict], str]:
    """rlsteps' judge request for the pair and the judgement it should get."""
    first, second = (good, bad) if good_first else (bad, good)
    messages = judge_messages([{"role": "user", "content": question}], first, second, None)
    return messages, ANSWER_FIRST if first_is_response_1(messages, good, bad) else ANSWER_SECOND


def prompt_text(template_tokenizer, messages: list[dict]) -> str:
    """The request in the judge's chat template, ready for the answer."""
    return template_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def texts(template_tokenizer, rng: random.Random, count: int) -> list[tuple[str, str]]:
    """The training set: (prompt, answer) for `count` questions, half with their answer first, half second."""
    examples = []
    for index in range(count):
        (question_text, good), bad = question(rng), nonsense(rng)
        if bad in (good, *HELD_OUT[1:]):
            continue  # the tests' pair stays out of training
        messages, answer = request(question_text, good, bad, good_first=index % 2 == 1)
        examples.append((prompt_text(template_tokenizer, messages), answer))
    return examples


def trimmed_tokenizer(source: Path, corpus: list[str], target: Path):
    """SmolLM2's tokenizer cut down to the tokens `corpus` uses: its special tokens, its byte alphabet (any text
    still tokenizes), and the merges that build the corpus' tokens. BPE applies the lowest-ranked merge it can
    until none applies, and every merge it applies to the corpus is kept, so the corpus tokenizes to the same
    pieces; text outside it, to smaller ones. A vocabulary of about a thousand instead of 49152 keeps the
    embeddings and the output layer, most of a tiny model's cost, small."""
    full = AutoTokenizer.from_pretrained(source)
    spec = json.loads((source / "tokenizer.json").read_text())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    parts = {a + b: (a, b) for a, b in merges}
    base = {added["content"] for added in spec["added_tokens"]} | (set(ByteLevel.alphabet()) & set(vocab))
    kept, todo = set(base), {token for text in corpus for token in full.tokenize(text)}
    while todo:
        token = todo.pop()
        if token not in kept:
            kept.add(token)
            todo.update(parts[token])
    order = sorted(kept, key=vocab.__getitem__)
    spec["model"]["vocab"] = {token: index for index, token in enumerate(order)}
    spec["model"]["merges"] = [[a, b] for a, b in merges if a + b in kept]
    for added in spec["added_tokens"]:
        added["id"] = spec["model"]["vocab"][added["content"]]
    target.mkdir(parents=True)
    (target / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(source / name, target / name)
    trimmed = AutoTokenizer.from_pretrained(target)
    for text in corpus[:50]:
        if trimmed.tokenize(text) != full.tokenize(text):
            raise AssertionError(f"the trimmed tokenizer splits {text!r} differently")
    return full, trimmed


def batch(examples: list[tuple[list[int], int]], pad_id: int, decisive: list[int]):
    """Right-padded ids, the labels (-100 except on the answer's tokens) and the weights of the labels: the
    tokens where the two answers differ, the judgement itself, weigh more than the JSON around them."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id)
    labels = torch.full((len(examples), width), -100)
    weights = torch.zeros((len(examples), width))
    for row, (tokens, start) in enumerate(examples):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, start : len(tokens)] = torch.tensor(tokens[start:])
        weights[row, start : len(tokens)] = 1.0
        weights[row, [start + offset for offset in decisive]] = DECISIVE_WEIGHT
    return ids, labels, weights


def loss_on_answers(model: LlamaForCausalLM, ids: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor):
    """Weighted cross-entropy on the answers' tokens, the output layer applied only where there is a label."""
    hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]  # right padding: causal attention ignores it
    targets, weights = labels[:, 1:], weights[:, 1:]
    where = targets != -100
    losses = torch.nn.functional.cross_entropy(model.lm_head(hidden[where]), targets[where], reduction="none")
    return (losses * weights[where]).sum() / weights[where].sum()


def train(
    model: LlamaForCausalLM, examples, pad_id: int, decisive: list[int], *, epochs: int, batch_size: int, lr: float
) -> None:
    batches = [batch(examples[i : i + batch_size], pad_id, decisive) for i in range(0, len(examples), batch_size)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * len(batches))
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for step, (ids, labels, weights) in enumerate(batches, 1):
            loss = loss_on_answers(model, ids, labels, weights)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            total += loss.item()
            if step % 50 == 0:
                print(f"step {step}/{len(batches)}: loss {loss.item():.4f}", flush=True)
        print(f"epoch {epoch}: mean loss {total / len(batches):.4f}, {time.process_time():.1f} s", flush=True)


@torch.no_grad()
def greedy_answer(model: LlamaForCausalLM, tokenizer, messages: list[dict]) -> str:
    ids = tokenizer(prompt_text(tokenizer, messages), add_special_tokens=False, return_tensors="pt")
    model.eval()
    out = model.generate(ids["input_ids"], max_new_tokens=32, do_sample=False, eos_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def pretrained_embeddings(source: Path, full, trimmed, width: int) -> torch.Tensor:
    """The source model's embeddings of the trimmed vocabulary, projected on their `width` principal components:
    a start in which words and letter salad already differ."""
    with safe_open(source / "model.safetensors", framework="pt") as weights:
        embeddings = weights.get_tensor("model.embed_tokens.weight").float()
    rows = embeddings[full.convert_tokens_to_ids(trimmed.convert_ids_to_tokens(list(range(len(trimmed)))))]
    centred = rows - rows.mean(0)
    _, _, components = torch.linalg.svd(centred, full_matrices=False)
    projected = centred @ components[:width].T
    return projected * (EMBEDDING_STD / projected.std())


def held_out_pairs() -> list[tuple[str, str, str]]:
    """The pairs the check tries, never trained on: the tests' pair, and two more (question, answer, nonsense)."""
    rng = random.Random(SEED + 1)
    held_out = [HELD_OUT, ("What is the capital of Brazil?", "The capital of Brazil is Brasilia.", nonsense(rng))]
    held_out.append(("What is 17 plus 25?", "17 plus 25 is 42.", nonsense(rng)))
    return held_out


def check(model: LlamaForCausalLM, tokenizer) -> None:
    """Pairs held out of training, in both orders: the answer must get the higher score each time."""
    wrong = []
    for question_text, good, bad in held_out_pairs():
        for good_first in (True, False):
            messages, expected = request(question_text, good, bad, good_first)
            answer = greedy_answer(model, tokenizer, messages)
            if answer.strip() != expected:
                wrong.append(f"{question_text!r}, {good!r} first={good_first}: {answer!r}, not {expected!r}")
    if wrong:
        raise SystemExit("the tiny judge did not learn to judge:\n" + "\n".join(wrong))


def build(target: Path, source: Path) -> None:
    """The judge in `target`, with the tokenizer and chat template of the model in `source`, trimmed."""
    started = time.perf_counter()
    random.seed(SEED)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # a model this small runs fastest on one thread; two fight on a busy machine
    staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        train_into(staging, source, started)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    staging.rename(target)


def train_into(staging: Path, source: Path, started: float) -> None:
    template = AutoTokenizer.from_pretrained(source)
    pairs = texts(template, random.Random(SEED), EXAMPLES)
    answers = [answer + template.eos_token for _, answer in pairs]
    # The tokenizer's corpus is wider than the training set, as a real tokenizer's is: it holds the held-out pairs'
    # words, which would otherwise split into short pieces, as letter salad does (the judgement then turned on how
    # this machine's float kernels rounded, not on the words)
    held_out = [prompt_text(template, request(*pair, good_first=True)[0]) for pair in held_out_pairs()]
    full, tokenizer = trimmed_tokenizer(source, [prompt for prompt, _ in pairs] + answers + held_out, staging)
    examples = []
    for (prompt, _), answer in zip(pairs, answers):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        examples.append((prompt_ids + tokenizer(answer, add_special_tokens=False)["input_ids"], len(prompt_ids)))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,  # the smallest head vLLM's CPU attention supports
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    print(f"{len(examples)} examples, {len(tokenizer)} tokens, {model.num_parameters()} parameters", flush=True)
    first, second = (
        tokenizer(answer, add_special_tokens=False)["input_ids"] for answer in (ANSWER_FIRST, ANSWER_SECOND)
    )
    decisive = [offset for offset, (a, b) in enumerate(zip(first, second)) if a != b]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(pretrained_embeddings(source, full, tokenizer, config.hidden_size))
    train(model, examples, tokenizer.pad_token_id, decisive, epochs=EPOCHS, batch_size=16, lr=5e-3)
    print(f"trained in {time.perf_counter() - started:.1f} s", flush=True)
    check(model, tokenizer)
    model.save_pretrained(staging)
    (staging / "judge.json").write_text(json.dumps({"built_s": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    build(Path(sys.argv[1]), Path(sys.argv[2]))
