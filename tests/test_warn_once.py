"""rlprof's one warn-once helper (src/rlprof/warn_once.py): per process, per scope, or inherited by the processes
started after it (a vLLM engine's EngineCore and workers)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from rlprof import warn_once as module
from rlprof.warn_once import ENV_SAID, warn_once


@pytest.fixture(autouse=True)
def nothing_said_yet(monkeypatch):
    monkeypatch.setattr(module, "_said_here", set())
    monkeypatch.delenv(ENV_SAID, raising=False)


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rlprof"]


def test_a_key_is_said_once_per_process_with_its_arguments(caplog):
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        assert warn_once(("fault", "step"), "rlprof: backend failed at step %d", 3)
        assert not warn_once(("fault", "step"), "rlprof: backend failed at step %d", 4)
        assert warn_once(None, "rlprof: a message is its own key")
        assert not warn_once(None, "rlprof: a message is its own key")
    assert said(caplog) == ["rlprof: backend failed at step 3", "rlprof: a message is its own key"]


def test_a_narrower_scope_says_it_again(caplog):
    first, second = set(), set()
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        for scope in (first, second, first):
            warn_once("nested", "rlprof: said in %s", "a scope", said=scope)
    assert len(said(caplog)) == 2 and first == second == {"nested"}


def test_inherited_marks_keep_the_processes_started_after_from_saying_it_again(caplog):
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        assert warn_once(None, "rlprof: vLLM 9.9 is outside the releases the plugin knows", inherit=True)
    child = (
        "import sys; from rlprof.warn_once import warn_once; "
        "warn_once(None, 'rlprof: vLLM 9.9 is outside the releases the plugin knows', inherit=True); "
        "warn_once(None, 'rlprof: a new one', inherit=True)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, env=dict(os.environ), timeout=60
    )
    assert proc.returncode == 0 and proc.stderr.strip().splitlines() == ["rlprof: a new one"]
