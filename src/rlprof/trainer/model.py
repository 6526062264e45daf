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
    config = config_cls(vocab_size=vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                        num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=cfg.max_position_embeddings,
                        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
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
