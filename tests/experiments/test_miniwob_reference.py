"""MiniWoB++'s own environment (the `miniwob` package on the system Chromium), the reference
for the capsule benchmark's reset latency: it times real resets, it is really seeded, and
closing it leaves no ChromeDriver or Chromium process behind."""

from __future__ import annotations

import math
import os

import pytest

from cua_jax.envs.capsules import process_tree
from experiments.benchmarks.miniwob_reference import MiniWoBSeleniumEnvironment, reset_latencies, running

pytestmark = [pytest.mark.browser]

TASK = "click-checkboxes"


def _command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:  # ended meanwhile
        return ""


def _browser_processes() -> list[int]:
    """Running ChromeDriver / Chromium processes under this test process."""
    return [pid for pid in running(process_tree([os.getpid()])) if _command_name(pid).startswith("chrom")]


def _episode(observation: dict) -> tuple:
    """What a seed decides: the utterance and every DOM element's tag, text and value."""
    return observation["utterance"], tuple((e["tag"], e["text"], e["value"]) for e in observation["dom_elements"])


def test_reset_latencies_are_three_positive_durations_and_leave_no_browser():
    latencies = reset_latencies(TASK, [1, 2, 3])
    assert len(latencies) == 3
    assert all(math.isfinite(s) and s > 0 for s in latencies), latencies
    assert _browser_processes() == []


def test_reset_is_seeded_and_close_ends_every_browser_process():
    with MiniWoBSeleniumEnvironment(TASK) as env:
        processes = env.process_ids
        names = {_command_name(pid) for pid in processes}
        assert "chromedriver" in names and "chromium" in names, names
        first = _episode(env.reset(7))
        other_seeds = [_episode(env.reset(seed)) for seed in (8, 9, 10)]
        again = _episode(env.reset(7))
        assert env.observation["screenshot"].shape[2] == 3  # the first observation includes the screenshot
    assert first[0] and first[1]
    assert again == first
    assert all(episode != first for episode in other_seeds)
    assert running(processes) == []
    assert _browser_processes() == []
