"""model.path: a local Hugging Face checkpoint directory (model + tokenizer) instead of the tiny default."""

import json

from conftest import run_cli


def _save_checkpoint(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlprof.trainer.config import ModelConfig
    from rlprof.trainer.data import CharTokenizer
    from rlprof.trainer.model import build_model

    chars = CharTokenizer()
    vocab = {tok: i for i, tok in enumerate(chars.vocab)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    tok.save_pretrained(path)
    build_model(
        ModelConfig(hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1), len(vocab), seed=5
    ).save_pretrained(path)


def test_train_from_local_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    _save_checkpoint(ckpt)
    proc = run_cli(
        "train",
        f"model.path={ckpt}",
        "trainer.steps=3",
        f"trainer.output_dir={tmp_path}/train",
        "global_profiler.tool=null",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "train").iterdir()]
    history = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in history] == [1, 2, 3]
    assert all(m["response_length"] > 0 for m in history)
