"""The work a pass of the model does: its FLOPs and the bytes it must move, from the model (the document's `model`,
frameworks/hf_models.py) and what the pass computed (tokens, the query-key pairs its attention scored, the context a
decode step read), in the conventions of the frameworks' own formulas, so that rlprof's figures can be set beside
theirs:

- a training pass (the update, a log-prob pass) as verl counts it (verl 0.9.1, `verl/utils/flops_counter.py`,
  `_estimate_qwen2_flops` and its MoE sibling): `2 x passes x (N x tokens + pairs x head_dim x heads x layers)`, N
  the dense parameters (attention and MLP linears of every layer, the embedding and the LM head both), pairs the
  sum of each sequence's length squared (verl's causal half of 12 x sum(len^2)), passes 3 for an update (forward and
  backward) and 1 for a forward pass (verl's log-prob mfu is the update's over 3). Its bytes, at least: the weights
  read once per forward and once per backward, the gradients written once;
- a decode step (an engine iteration) as vLLM counts it (vLLM 0.32, `vllm/v1/metrics/perf.py`, its attention, FFN
  and unembedding components): FLOPs of the linears on every token computed, attention `4 x heads x head_dim x
  layers x pairs`, the LM head on the tokens that need logits (a prefill's last, every decoded one); bytes read and
  written by each component (weights once, activations in and out, the KV cache read and written).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...frameworks.hf_models import DTYPE_BYTES

# A pass over the model, by stage: forward and backward (3 forwards' FLOPs, as verl counts an update) or a forward
UPDATE_PASSES = 3
PASSES = {"actor_update": UPDATE_PASSES, "actor_compute_log_prob": 1, "ref_compute_log_prob": 1}


@dataclass(frozen=True)
class Shape:
    """What the work of a pass depends on, from a model record."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0
    weight_bytes: int = 4
    cache_bytes: int = 4

    @classmethod
    def of(cls, model: dict | None) -> Shape | None:
        if not model or not model.get("hidden_size"):
            return None
        weight = DTYPE_BYTES.get(model.get("dtype"), 4)
        return cls(
            hidden=model["hidden_size"],
            layers=model["num_hidden_layers"],
            heads=model["num_attention_heads"],
            kv_heads=model["num_key_value_heads"],
            head_dim=model["head_dim"],
            intermediate=model["intermediate_size"],
            vocab=model["vocab_size"],
            experts=model.get("num_experts", 0),
            experts_per_tok=model.get("num_experts_per_tok", 0),
            moe_intermediate=model.get("moe_intermediate_size", 0),
            shared_experts=model.get("num_shared_experts", 0),
            weight_bytes=weight,
            cache_bytes=DTYPE_BYTES.get(model.get("kv_cache_dtype"), weight),
        )

    @property
    def attention_linears(self) -> int:
        """Parameters of one layer's q, k, v and output projections."""
        return self.hidden * (2 * self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim)

    @property
    def mlp(self) -> int:
        """Parameters one token passes through in one layer's MLP: SwiGLU's three matrices, or the router and its
        experts' (and the shared experts')."""
        if not self.experts:
            return 3 * self.hidden * self.intermediate
        chosen = self.experts_per_tok + self.shared_experts
        return self.hidden * self.experts + 3 * self.hidden * self.moe_intermediate * chosen

    @property
    def dense_params(self) -> int:
        """verl's dense N: every layer's linears a token passes through, the embedding and the LM head."""
        return (self.attention_linears + self.mlp) * self.layers + 2 * self.vocab * self.hidden

    def weights_read(self, tokens: float) -> float:
        """Bytes of weights a forward over `tokens` reads at least: every layer's linears (a mixture of experts' that
        the tokens reach, at most all of them) and the LM head."""
        if self.experts:
            reached = min(tokens * self.experts_per_tok, self.experts) + self.shared_experts
            mlp = self.hidden * self.experts + 3 * self.hidden * self.moe_intermediate * reached
        else:
            mlp = self.mlp
        return ((self.attention_linears + mlp) * self.layers + self.vocab * self.hidden) * self.weight_bytes

    # ---- a training pass, verl's convention -------------------------------------------------------------------
    def train_flops(self, passes: int, tokens: float, pairs: float) -> float:
        return 2 * passes * (self.dense_params * tokens + pairs * self.head_dim * self.heads * self.layers)

    def train_bytes(self, passes: int, tokens: float) -> float:
        """A forward reads the weights once; forward and backward read them twice and write their gradients."""
        return self.weights_read(tokens) * (1 if passes == 1 else 3)

    # ---- an engine iteration, vLLM's per-iteration model ---------------------------------------------------------
    def decode_flops(self, tokens: float, prefill_seqs: float, prefill_tokens: float, pairs: float) -> float:
        d, q, kv, h, n = self.head_dim, self.heads, self.kv_heads, self.hidden, self.layers
        logits = prefill_seqs + (tokens - prefill_tokens)  # a prefill needs its last token's logits only
        linears = 2 * tokens * h * (q + 2 * kv) * d + 2 * tokens * h * q * d
        if self.experts:
            ffn = 6 * h * self.moe_intermediate * tokens * (self.experts_per_tok + self.shared_experts)
        else:
            ffn = 6 * h * self.intermediate * tokens
        return n * (linears + ffn) + 4 * q * pairs * d * n + 2 * logits * h * self.vocab

    def decode_bytes(self, tokens: float, prefill_seqs: float, prefill_tokens: float, context: float) -> float:
        """Bytes read and written (vLLM's read and write breakdowns summed)."""
        d, q, kv, h, n = self.head_dim, self.heads, self.kv_heads, self.hidden, self.layers
        a, w, c = self.weight_bytes, self.weight_bytes, self.cache_bytes  # activations in the model's dtype
        t = tokens
        attention_read = t * h * a + h * (q + 2 * kv) * d * w + t * q * d * a + 2 * context * kv * d * c
        attention_read += t * q * d * a + q * d * h * w
        attention_write = t * (q + 2 * kv) * d * a + 2 * t * kv * d * c + t * h * a
        ffn = 0.0
        if self.experts:
            mi, routed = self.moe_intermediate, t * self.experts_per_tok
            reached = min(routed, self.experts)
            ffn += routed * h * a + 3 * h * mi * reached * w + 3 * routed * mi * a  # routed experts: read
            ffn += 3 * routed * mi * a + routed * h * a  # and written
            if self.shared_experts:
                s = self.shared_experts
                ffn += t * h * a + 3 * h * mi * s * w + 2 * t * mi * s * a + t * mi * a
                ffn += 3 * t * s * mi * a + t * s * h * a
        else:
            di = self.intermediate
            ffn += (
                t * h * a + 3 * h * di * w + 3 * t * di * a
            )  # read: input, up/gate/down weights, SiLU and down inputs
            ffn += 3 * t * di * a + t * h * a  # written: up/gate, SiLU and down outputs
        logits = prefill_seqs + (t - prefill_tokens)
        unembed = logits * h * a + h * self.vocab * w + logits * self.vocab * a
        return n * (attention_read + attention_write + ffn) + unembed
