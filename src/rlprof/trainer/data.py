"""A character tokenizer built locally and a synthetic verifiable task generated in memory.

Task sum_mod10: the prompt "a+b=" (two digits) asks for (a + b) mod 10 as one digit, then EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..frameworks.hf_models import CHAR_ALPHABET, CHAR_SPECIALS


class CharTokenizer:
    """Digits, '+', '=' and three special tokens. Small on purpose: the policy is tiny."""

    specials = CHAR_SPECIALS

    def __init__(self, alphabet: str = CHAR_ALPHABET):
        self.vocab = list(self.specials) + list(alphabet)
        self.ids = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        return [self.bos_id] + [self.ids[ch] for ch in text]

    def decode(self, ids) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i >= len(self.specials):
                out.append(self.vocab[i])
        return "".join(out)


@dataclass
class PromptBatch:
    input_ids: torch.Tensor  # (B, P) left-padded
    attention_mask: torch.Tensor  # (B, P)
    answers: list[str]


class SumMod10Task:
    def __init__(self, tokenizer, seed: int):
        self.tok = tokenizer
        self.gen = torch.Generator().manual_seed(seed)

    def sample(self, n_prompts: int) -> PromptBatch:
        ab = torch.randint(0, 10, (n_prompts, 2), generator=self.gen)
        texts = [f"{a}+{b}=" for a, b in ab.tolist()]
        answers = [str((a + b) % 10) for a, b in ab.tolist()]
        return left_pad([self.tok.encode(t) for t in texts], self.tok.pad_id, answers)


def left_pad(seqs: list[list[int]], pad_id: int, answers: list[str]) -> PromptBatch:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
    return PromptBatch(ids, mask, answers)
