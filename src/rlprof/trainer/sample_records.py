"""The trainer's rollout, sample by sample: one record per generated sequence (analyze/inputs/samples_file.py names the
fields), written to `samples/rlprof_rank<R>.jsonl` of the run directory (`samples/vllm_rank<R>.jsonl` where vLLM
generates) for every step the Profiler watches or profiles (`Profiler.samples_wanted`).

rlprof's engine (rollout.py, sync or in an async replica) keeps, where asked, the wall clock at its start and the
perf counter after each decode step; a row that generated n tokens (EOS included, as the response mask counts
them) was active in decode steps 0..n-1 of its pass, numbered as the `rlprof:decode_step:K` ranges of a window:
its `end_us` is the end of step n-1, its `prefill_ms` step 0 (the prompt's forward pass, which gives the first
token) and its `decode_ms` steps 1..n-1. With DAPO's dynamic sampling each record says its prompt's group in the
pass and whether the filter dropped that group (its rewards all equal). An async replica's sample waited `queue_ms` from the driver's submission to
the replica's start. `reward_ms` is its own scoring call (trainer/reward.py). vLLM's samples are vLLM's own
(collect/vllm_samples.py), to which the trainer adds the sample's index in the batch, its turn and its reward time.
"""

from __future__ import annotations

from ..analyze.inputs.samples_file import is_engine_record
from ..collect.engine import replica_profiles
from ..collect.samples import SampleWriter, record


class TrainerSamples:
    """One trainer process's sample records: the step's samples counted across its generation passes (DAPO's
    refills), the test aid trainer.debug.long_sample applied, each pass's records built from what its engine kept
    (`kind`: rlprof's own engine in this process, "async" replicas, or "vllm") and written on the first record."""

    def __init__(self, prof, cfg, rank: int, kind: str = "rlprof"):
        self.prof, self.rank, self.kind = prof, rank, kind
        self.replicas = cfg.rollout.replicas if kind == "async" else 0
        self.long = cfg.trainer.debug.long_sample
        self.step = 0
        self.passes = 0  # generation passes of this step so far
        self.count = 0  # samples of this step so far: the next pass's first `sample`
        self._writer: SampleWriter | None = None

    def wanted(self, step: int) -> bool:
        """Whether this step's rollout records its samples: the Profiler's answer, and in async mode also where a
        replica profiles the step (the driver hosts no rollout window of its own)."""
        if self.prof.samples_wanted:
            return True
        return any(replica_profiles(self.prof.plan, i, step) for i in range(self.replicas))

    def begin_pass(self, step: int, rows: int) -> tuple[int, int, list[int] | None]:
        """(this pass's index in the step, its first sample's index, its rows that may not stop early)."""
        if step != self.step:
            self.step, self.passes, self.count = step, 0, 0
        first, long = self.count, self.long
        hold = None
        if long.from_step is not None and long.applies(step, self.rank) and first <= long.sample < first + rows:
            hold = [long.sample - first]
        return self.passes, first, hold

    def end_pass(
        self, step: int, rollout_pass: int, first: int, rollout, timing: list | None, reward_ns, filtered=None
    ) -> None:
        """The pass is generated and scored: its records written where the step records them (`timing` not None);
        `filtered` (DAPO's dynamic sampling): per group of the pass, whether the filter dropped it."""
        rows = rollout.prompt_ids.shape[0]
        self.passes += 1
        self.count += rows
        if timing is None:
            return
        prompt = rollout.prompt_mask.sum(1).long().tolist()  # counts, whatever the masks' dtype
        response = rollout.response_mask.sum(1).long().tolist()
        common = dict(rollout_pass=rollout_pass, rank=self.rank)
        if self.kind == "vllm":  # the step is the engine's records' own (EngineSamples.begin)
            records = [
                r
                for order, kept in timing
                for r in vllm_records(kept, order, first_sample=first, reward_ns=reward_ns, **common)
            ]
        elif self.kind == "async":  # per replica: (replica, its rows lo..hi, its clock, when the driver sent them)
            records = [
                r
                for replica, lo, hi, clock, submitted_ns in timing
                for r in engine_records(
                    first_sample=first + lo,
                    prompt_tokens=prompt[lo:hi],
                    response_tokens=response[lo:hi],
                    clock=clock,
                    reward_ns=None if reward_ns is None else reward_ns[lo:hi],
                    replica=replica,
                    submitted_ns=submitted_ns,
                    step=step,
                    **common,
                )
            ]
        else:
            records = engine_records(
                first_sample=first,
                prompt_tokens=prompt,
                response_tokens=response,
                clock=timing,
                reward_ns=reward_ns,
                step=step,
                **common,
            )
        if filtered is not None:  # each row's group: rollout.n consecutive rows per prompt
            per_group = rows // max(len(filtered), 1)
            for r in records:
                group = (r["sample"] - first) // per_group
                r["group"], r["group_filtered"] = group, bool(filtered[group])
        if self._writer is None:
            source = "vllm" if self.kind == "vllm" else "rlprof"
            self._writer = SampleWriter(self.prof.watch_dir, source, rank=self.rank, said=self.prof.said)
        self._writer.write(records)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def engine_records(
    *,
    step: int,
    rollout_pass: int,
    first_sample: int,
    prompt_tokens: list[int],
    response_tokens: list[int],
    clock: list[int],
    reward_ns: list[int] | None = None,
    rank: int | None = None,
    replica: int | None = None,
    submitted_ns: int | None = None,
) -> list[dict]:
    """The records of one pass of rlprof's engine over some rows: `clock` as generate() filled it (wall ns at the
    start, perf ns at the start, perf ns after each decode step); `submitted_ns`: the driver's wall clock when it
    sent these rows to a replica (async)."""
    wall_ns, t0, ends = clock[0], clock[1], clock[2:]
    queue_ms = None if submitted_ns is None else max(0, wall_ns - submitted_ns) / 1e6
    # what every row of the pass shares, then each row's own (a dict literal per row: the records cost a step well
    # under 1%, bench/samples_cost.py)
    shared = record(
        step=step,
        rank=rank,
        replica=replica,
        start_us=wall_ns // 1000,
        turns=1,
        queue_ms=queue_ms,
        source="rlprof",
        rollout_pass=rollout_pass,
    )
    prefill_ms = (ends[0] - t0) / 1e6 if ends else None
    out = []
    for i, (prompt, n) in enumerate(zip(prompt_tokens, response_tokens)):
        r = {**shared, "sample": first_sample + i, "prompt_tokens": prompt, "response_tokens": n}
        if 1 <= n <= len(ends):  # active in decode steps 0..n-1 of the pass
            end = ends[n - 1]
            r["end_us"] = (wall_ns + end - t0) // 1000
            r["prefill_ms"] = prefill_ms
            r["decode_ms"] = (end - ends[0]) / 1e6
            r["first_decode_step"] = 0
            r["last_decode_step"] = n - 1
        if reward_ns is not None:
            r["reward_ms"] = reward_ns[i] / 1e6
        out.append(r)
    return out


def vllm_records(
    records: list[dict],
    order: dict[str, int],
    *,
    rollout_pass: int,
    first_sample: int,
    reward_ns: list[int] | None,
    rank: int,
) -> list[dict]:
    """vLLM's records of one pass (collect/vllm_samples.py), each given its row's index in the batch (`order`:
    request id -> row), its turn, its reward time, the pass and the trainer's rank; the engine's record of the pass
    after them, given the pass and the rank."""
    out, engine = [], []
    for r in records:
        if is_engine_record(r):  # the engine's scheduler over the pass (collect/vllm_samples.py)
            engine.append(dict(r, rank=rank, rollout_pass=rollout_pass))
            continue
        row = order.get(r.get("request_id"))
        if row is None:
            continue  # a request of another caller of the engine
        r = dict(r, sample=first_sample + row, turns=1, rank=rank, rollout_pass=rollout_pass)
        if reward_ns is not None:
            r["reward_ms"] = reward_ns[row] / 1e6
        out.append(r)
    return sorted(out, key=lambda r: r["sample"]) + engine
