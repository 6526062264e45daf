"""The policy: a tiny Qwen2/Llama-style causal LM built from a config (no download), or a local checkpoint."""

from __future__ import annotations

import torch

from .config import ModelConfig
from .data import CharTokenizer


def build_model(cfg: ModelConfig, vocab_size: int, seed: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    if cfg.path is not None:
        return AutoModelForCausalLM.from_pretrained(cfg.path, local_files_only=True, torch_dtype=torch.float32)
    torch.manual_seed(seed)
    config_cls = Qwen2Config if cfg.arch == "qwen2" else LlamaConfig
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return AutoModelForCausalLM.from_config(config)


def build_tokenizer(cfg: ModelConfig):
    """The local character tokenizer; a checkpoint directory brings its own tokenizer instead."""
    if cfg.path is None:
        return CharTokenizer()
    from transformers import AutoTokenizer

    return HFTokenizerAdapter(AutoTokenizer.from_pretrained(cfg.path, local_files_only=True))


class HFTokenizerAdapter:
    """The few tokenizer methods the trainer uses, over a Hugging Face tokenizer."""

    def __init__(self, tok):
        self.tok = tok
        self.eos_id = tok.eos_token_id
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.bos_id = tok.bos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.tok)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self.tok.decode(ids, skip_special_tokens=True).strip()


def build_char_checkpoint(path, chars: list[str], seed: int = 0):
    """A tiny Qwen2 (hidden 64, 2 layers) and a character-level fast tokenizer over `chars` (which must end with
    <pad>, <bos>, <eos>), saved as a local Hugging Face checkpoint: what other frameworks load (TRL's reference model,
    verl's workers) where they take a model path. Built once; an existing checkpoint is left as it is."""
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    if (path / "config.json").exists():
        return path
    vocab = {tok: i for i, tok in enumerate(chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(chars),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=vocab["<pad>"],
        bos_token_id=vocab["<bos>"],
        eos_token_id=vocab["<eos>"],
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path
