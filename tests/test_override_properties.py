"""Property-based: no override string, however odd, gives a traceback (Hydra's grammar reads them). Each is either read into a plan or refused
with one ConfigError line (the CLI's exit 2); a sample goes through the CLI itself."""

import string

from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import run_cli
from rlprof.config import load_plan
from rlprof.errors import RLProfError

PROFILER_KEYS = [
    "actor_rollout_ref.actor.profiler.ranks",
    "actor_rollout_ref.actor.profiler.enable",
    "actor_rollout_ref.actor.profiler.tool_config.torch.schedule",
    "actor_rollout_ref.rollout.profiler.tool",
    "global_profiler.steps",
    "global_profiler.tool",
    "global_profiler.save_path",
    "profiler_config.integrated.profile_ranks",
    "profiler_config.integrated.stage",
    "trainer.profile_steps",
    "actor_rollout_ref.profiler.ranks",
]
# the characters shells, YAML and Hydra give meaning to, and a few others
ODD = st.text(alphabet=string.printable + "é…\u0000\u2028", max_size=24)
VALUE = st.one_of(
    ODD,
    st.sampled_from(
        [
            "[0,",
            "{a: 1",
            '"a" b',
            "'",
            "[[[",
            "${x}",
            "${oc.env:NOPE}",
            "!!python/none",
            "1e999",
            "-1",
            "null",
            "[]",
            "{}",
            "&a [*a]",
            "*a",
            "? x",
            "- 1",
            "|",
        ]
    ),
)
OVERRIDE = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(PROFILER_KEYS), VALUE),
    st.builds(lambda p, k, v: f"{p}{k}={v}", st.sampled_from(["+", "++", "~", "-", ""]), ODD, VALUE),
    ODD,
)


def resolves_or_refuses(overrides: list[str]) -> None:
    try:
        load_plan(None, overrides, device="cpu")
    except RLProfError as exc:
        text = str(exc)
        assert text and "\n" not in text.strip(), text  # one line
        assert "Traceback" not in text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OVERRIDE, min_size=1, max_size=3))
def test_any_override_resolves_or_is_refused_in_one_line(overrides):
    resolves_or_refuses(overrides)


def test_the_cli_says_one_line_and_exits_2_on_values_hydra_does_not_parse():
    for bad in (
        "actor_rollout_ref.actor.profiler.ranks=[0,",
        'trainer.default_local_dir="a" b',
        "x={a: 1",
        "global_profiler.steps=[1, 2",
    ):
        proc = run_cli("plan", bad)
        assert proc.returncode == 2, (bad, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "does not parse as Hydra parses it" in lines[0] and bad in lines[0], proc.stderr
