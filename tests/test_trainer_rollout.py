"""Rollout decoding with a KV cache, dynamic-sampling refill, and trainer config validation."""

import pytest
import torch

from rlprof.config import load_config
from rlprof.trainer.config import ModelConfig, parse_train_config
from rlprof.trainer.data import CharTokenizer, SumMod10Task
from rlprof.trainer.model import build_model
from rlprof.trainer.rollout import generate, sample_next


def _model(arch="qwen2"):
    tok = CharTokenizer()
    return build_model(ModelConfig(arch=arch), tok.vocab_size, seed=0).eval(), tok


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_kv_cache_decode_equals_full_recompute(arch):
    model, tok = _model(arch)
    prompts = SumMod10Task(tok, seed=1).sample(4)
    outs = []
    for use_cache in (True, False):
        gen = torch.Generator().manual_seed(3)
        logits_seen = []
        original = model.forward

        def spy(*a, original=original, logits_seen=logits_seen, **k):
            out = original(*a, **k)
            logits_seen.append(out.logits[:, -1].detach().clone())
            return out

        model.forward = spy
        try:
            r = generate(
                model,
                prompts.input_ids,
                prompts.attention_mask,
                max_new_tokens=6,
                eos_id=tok.eos_id,
                pad_id=tok.pad_id,
                ignore_eos=True,
                generator=gen,
                use_cache=use_cache,
            )
        finally:
            model.forward = original
        outs.append((r, logits_seen))
    (cached, l1), (full, l2) = outs
    assert torch.equal(cached.response_ids, full.response_ids)
    assert len(l1) == len(l2) == 6
    for a, b in zip(l1, l2):
        assert torch.allclose(a, b, atol=1e-5)  # same logits at every decode step


def test_left_padded_prompts_decode_like_unpadded():
    model, tok = _model()
    from rlprof.trainer.data import left_pad

    short = tok.encode("3+4=")
    batch = left_pad([short, tok.encode("12+34=")], tok.pad_id, ["7", "6"])
    alone = left_pad([short], tok.pad_id, ["7"])
    kw = dict(max_new_tokens=4, eos_id=tok.eos_id, pad_id=tok.pad_id, temperature=1e-4, ignore_eos=True)
    padded = generate(model, batch.input_ids, batch.attention_mask, **kw)
    single = generate(model, alone.input_ids, alone.attention_mask, **kw)
    assert torch.equal(padded.response_ids[0], single.response_ids[0])


def test_eos_stops_a_row_and_masks_after_it():
    model, tok = _model()
    prompts = SumMod10Task(tok, seed=2).sample(8)
    r = generate(
        model,
        prompts.input_ids,
        prompts.attention_mask,
        max_new_tokens=12,
        eos_id=tok.eos_id,
        pad_id=tok.pad_id,
        generator=torch.Generator().manual_seed(0),
    )
    for ids, mask in zip(r.response_ids, r.response_mask):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()
        if tok.eos_id in ids[:n].tolist():
            assert ids[n - 1] == tok.eos_id and (ids[n:] == tok.pad_id).all()


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.05, 0.05]]))
    draws = {int(sample_next(logits, 1.0, 0.8, torch.Generator().manual_seed(i))) for i in range(200)}
    assert draws == {0, 1}


def test_dapo_refill_replaces_uninformative_groups(monkeypatch):
    from rlprof.config import resolve_plan
    from rlprof.trainer.train import Trainer

    cfg = parse_train_config(
        load_config(
            None,
            [
                "trainer.algorithm=dapo",
                "data.prompts_per_step=4",
                "rollout.n=2",
                "actor.mini_batch_size=8",
                "actor.micro_batch_size=4",
            ],
        )
    )
    trainer = Trainer(cfg, resolve_plan({}))
    calls = []
    real = trainer._generate_and_score

    def scripted(step, batch):  # first draw: every group uniform; refills: informative groups
        rollout, rewards, scores = real(step, batch)
        calls.append(len(batch.answers))
        if len(calls) == 1:
            scores = torch.zeros_like(scores)
        else:
            scores = torch.tensor([1.0, 0.0] * (len(scores) // 2))
        return rollout, rewards, scores

    trainer._generate_and_score = scripted
    prompts = trainer.task.sample(4)
    rollout, rewards, scores, answers = trainer.sample(1, prompts)
    trainer.close()
    assert calls == [8, 8]  # one refill was enough
    assert rollout.response_ids.shape[0] == 8 and len(answers) == 8
    assert trainer.kept_groups == 4
    assert scores.tolist() == [1.0, 0.0] * 4
