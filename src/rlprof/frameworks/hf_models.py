"""The model a run computed with, in Hugging Face's terms: the fields of a checkpoint's config.json that the work of a
pass depends on, picked from whatever holds them (a config.json that verl and vLLM load, vLLM's engine, rlprof's
trainer), as one record every analysis document carries (`model`). Nothing here imports transformers: a config is a
dict (`PretrainedConfig.to_dict()` gives one).

The record: `model_type`, `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`,
`head_dim`, `intermediate_size`, `vocab_size`, `tie_word_embeddings`; for a mixture of experts `num_experts`,
`num_experts_per_tok`, `moe_intermediate_size`, `num_shared_experts`; `dtype` (what it computes in) and
`kv_cache_dtype` where an engine says; `source` (where it was read).
"""

from __future__ import annotations

REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# a mixture of experts' fields under the names the model families give them -> the record's name
MOE_NAMES = {
    "num_experts": ("num_experts", "n_routed_experts", "num_local_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_topk"),
    "moe_intermediate_size": ("moe_intermediate_size", "expert_hidden_dim"),
    "num_shared_experts": ("n_shared_experts", "num_shared_experts"),
}
DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float8_e4m3fn": "float8",
    "float8_e5m2": "float8",
    "fp8": "float8",
    "fp8_e4m3": "float8",
    "fp8_e5m2": "float8",
}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1}

# rlprof's trainer's character tokenizer (trainer/data.py builds it from these): its size is the vocabulary of a model
# the trainer built from its config, which trainer_config.json recorded before it carried the model itself
CHAR_SPECIALS = ("<pad>", "<bos>", "<eos>")
CHAR_ALPHABET = "0123456789+="


def dtype_name(value) -> str | None:
    """ "torch.bfloat16", "bf16", "bfloat16" -> "bfloat16"; None where unknown ("auto", absent)."""
    if value is None:
        return None
    text = str(value).lower().removeprefix("torch.")
    return DTYPES.get(text)


def model_record(config: dict, source: str, dtype=None, kv_cache_dtype=None) -> dict | None:
    """The record of a model from its Hugging Face config as a dict (a multimodal one's `text_config`); None where the
    config lacks what a pass's work depends on (REQUIRED). `dtype`: what it computes in where known better than the
    config's own `torch_dtype` (the dtype it was saved in)."""
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if not all(isinstance(text.get(k), int) and text.get(k) > 0 for k in REQUIRED):
        return None
    heads = text["num_attention_heads"]
    record = {
        "source": source,
        "model_type": config.get("model_type") or text.get("model_type"),
        "hidden_size": text["hidden_size"],
        "num_hidden_layers": text["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_key_value_heads") or heads,
        "head_dim": text.get("head_dim") or text["hidden_size"] // heads,
        "intermediate_size": text.get("intermediate_size") or 4 * text["hidden_size"],
        "vocab_size": text["vocab_size"],
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
    }
    for name, spellings in MOE_NAMES.items():
        value = next((text[s] for s in spellings if isinstance(text.get(s), int) and text[s] > 0), None)
        if value is not None:
            record[name] = value
    if "num_experts" in record:
        record.setdefault("num_experts_per_tok", 1)
        record.setdefault("moe_intermediate_size", record["intermediate_size"])
    record["dtype"] = dtype_name(dtype) or dtype_name(text.get("torch_dtype") or text.get("dtype")) or "float32"
    cache = dtype_name(kv_cache_dtype)
    if cache is not None:
        record["kv_cache_dtype"] = cache
    return record


def trainer_model(model_cfg: dict, source: str) -> dict | None:
    """The model rlprof's trainer built from its config's `model` section (`path` null: a Qwen2 or Llama of the
    config's sizes over the character tokenizer, tied embeddings, float32), for a trainer_config.json written before
    the trainer recorded its model; None where it loaded a checkpoint instead (its config.json says the rest)."""
    if not isinstance(model_cfg, dict) or model_cfg.get("path") is not None:
        return None
    try:
        config = {
            "model_type": model_cfg.get("arch") or "qwen2",
            "hidden_size": int(model_cfg["hidden_size"]),
            "num_hidden_layers": int(model_cfg["num_layers"]),
            "num_attention_heads": int(model_cfg["num_heads"]),
            "num_key_value_heads": int(model_cfg["num_kv_heads"]),
            "intermediate_size": int(model_cfg["intermediate_size"]),
            "vocab_size": len(CHAR_SPECIALS) + len(CHAR_ALPHABET),
            "tie_word_embeddings": True,
        }
    except (KeyError, TypeError, ValueError):
        return None
    return model_record(config, source, dtype="float32")
