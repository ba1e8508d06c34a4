"""Built-in toy tasks with checkable answers, a character tokenizer, and a tiny causal LM with a realistic
vocabulary, so that the trainers run anywhere with nothing downloaded (docs/trainers.md).

A task maps a prompt to its one correct answer. The RL trainers reward a completion by comparing it with
that answer; the preference trainers pair the answer (chosen) with a corrupted one (rejected).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

import torch

PAD, EOS = 0, 1
# Token ids 2.. are these characters. The model's vocabulary is far larger (128256 by default, Llama 3's):
# the other ids are never in a prompt, but the policy can sample them and the LM head pays for all of them.
CHARS = "0123456789+=abcdefgh"


class CharTokenizer:
    """One token per character of CHARS; PAD and EOS. decode() stops at EOS and drops ids that are no
    character (a sampled id beyond CHARS reads as nothing, so its answer is wrong)."""

    def __init__(self):
        self.ids = {c: i + 2 for i, c in enumerate(CHARS)}
        self.chars = {i: c for c, i in self.ids.items()}

    def encode(self, text: str) -> list[int]:
        return [self.ids[c] for c in text]

    def decode(self, ids) -> str:
        out = []
        for i in ids.tolist() if isinstance(ids, torch.Tensor) else ids:
            if i == EOS:
                break
            out.append(self.chars.get(i, ""))
        return "".join(out)


@dataclass(frozen=True)
class Addition:
    """`a+b=` with single digits a, b; the answer is the decimal sum (1 or 2 characters)."""

    name: str = "add"
    answer_len: int = 2

    def prompt(self, rng: random.Random) -> str:
        return f"{rng.randrange(10)}+{rng.randrange(10)}="

    def answer(self, prompt: str) -> str:
        return str(int(prompt[0]) + int(prompt[2]))

    def wrong(self, prompt: str, rng: random.Random) -> str:
        right = int(self.answer(prompt))
        return str(rng.choice([v for v in range(max(0, right - 3), right + 4) if v != right]))

    def reward(self, prompt: str, completion: str) -> float:
        return float(completion == self.answer(prompt))


@dataclass(frozen=True)
class Sorting:
    """`dbca=`: the prompt's letters (4 distinct of a-h) in alphabetical order."""

    name: str = "sort"
    answer_len: int = 4

    def prompt(self, rng: random.Random) -> str:
        return "".join(rng.sample("abcdefgh", self.answer_len)) + "="

    def answer(self, prompt: str) -> str:
        return "".join(sorted(prompt[:-1]))

    def wrong(self, prompt: str, rng: random.Random) -> str:
        letters = list(self.answer(prompt))
        i = rng.randrange(len(letters) - 1)  # one adjacent swap: almost right, still wrong
        letters[i], letters[i + 1] = letters[i + 1], letters[i]
        return "".join(letters)

    def reward(self, prompt: str, completion: str) -> float:
        """The fraction of the answer's positions the completion gets right, less 0.25 if its length is wrong
        (a dense, checkable reward: 1.0 only for the answer)."""
        answer = self.answer(prompt)
        right = sum(a == b for a, b in zip(answer, completion, strict=False)) / len(answer)
        return right - 0.25 * (len(completion) != len(answer))


TASKS = {t.name: t for t in (Addition(), Sorting())}


def task_reward(task, prompts: list[str], completions: list[str]) -> list[float]:
    """The task's checkable reward of each completion: the RL trainers' default reward function."""
    return [task.reward(p, c) for p, c in zip(prompts, completions, strict=True)]


def is_held_out(prompt: str) -> bool:
    """A fixed fifth of every task's prompts, never in a training pair: the preference accuracy is measured
    on them."""
    return zlib.crc32(prompt.encode()) % 5 == 0


def preference_pairs(task, n: int, seed: int, held_out: bool = False) -> list[tuple[str, str, str]]:
    """n (prompt, chosen, rejected) triples, the right answer against a near miss, drawn from the training
    prompts (or, held_out=True, from the held-out ones)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        p = task.prompt(rng)
        if is_held_out(p) == held_out:
            out.append((p, task.answer(p), task.wrong(p, rng)))
    return out


def tiny_causal_lm(vocab_size: int = 128256, hidden_size: int = 64, num_layers: int = 2, seed: int = 0,
                   context_length: int = 64):  # fmt: skip
    """A Qwen2-architecture causal LM with a tied embedding and `vocab_size` outputs, randomly initialized
    from `seed` (float32). At the default sizes its embedding holds almost all of its ~8.3M parameters,
    as a 128k vocabulary dominates a real small model's head."""
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=EOS, max_position_embeddings=context_length,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(config)
