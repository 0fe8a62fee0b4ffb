"""The baselines behind the capsule interface: a browser, or a Docker container, per environment."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.browser_baselines import (
    CONTAINER_IMAGE_NAME,
    CONTAINER_NAME_PREFIX,
    BrowserPerEnvironmentBackend,
    ContainerPerEnvironmentBackend,
)
from cua_jax.envs.capsules import CapsuleRuntime
from cua_jax.envs.miniwob_oracle import oracle_action
from cua_jax.types import EpisodeStatus


def _solve(rt: CapsuleRuntime, env: str):
    obs = rt.observe(env)
    while not (result := rt.step(env, oracle_action(obs))).done:
        obs = result.observation
    return result


def _running_containers(name_prefix: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "--format", "{{.Names}}"], capture_output=True, text=True, check=True)
    return [n for n in out.stdout.split() if n.startswith(name_prefix)]


@pytest.mark.browser
def test_browser_per_environment_runs_episodes_forks_and_confines_crashes():
    rt = CapsuleRuntime(BrowserPerEnvironmentBackend(), call_timeout_s=300)
    try:
        a = rt.create("click-option", seed=3)
        b = rt.create("click-option", seed=4)
        assert len(rt.backend.pids()) == 2  # a browser process each
        rt.step(a, oracle_action(rt.observe(a)))  # select the option
        twin = rt.fork(a)
        assert rt.observe(twin).same_as(rt.observe(a))
        assert _solve(rt, a).success and _solve(rt, twin).success
        # Killing b's browser quarantines b alone.
        victim = rt.runtime_of(b)
        pid = rt.backend.browser_pid(victim)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not rt.crashes and time.monotonic() < deadline:
            time.sleep(0.1)
        result = rt.step(b, A.Screenshot())
        assert result.status == EpisodeStatus.QUARANTINED and victim in result.quarantine_reason
        rt.reset(a, seed=5)
        assert _solve(rt, a).success
        rt.reset(b, seed=6)
        assert _solve(rt, b).success
    finally:
        rt.shutdown()
    assert rt.backend.pids() == []


@pytest.mark.docker
@pytest.mark.slow
def test_container_per_environment_runs_episodes_and_forks():
    from cua_jax.envs.images import build

    image = build(CONTAINER_IMAGE_NAME)  # a no-op when the current sources are built
    rt = CapsuleRuntime(ContainerPerEnvironmentBackend(image), call_timeout_s=300)
    try:
        env = rt.create("enter-text", seed=8)
        assert _running_containers(CONTAINER_NAME_PREFIX)
        network = subprocess.run(
            ["docker", "inspect", "-f", "{{.HostConfig.NetworkMode}}", rt.backend.container_name(rt.runtime_of(env))],
            capture_output=True,
            text=True,
        ).stdout.strip()
        assert network == "none"
        obs = rt.observe(env)
        obs = rt.step(env, oracle_action(obs)).observation  # focus the field
        twin = rt.fork(env)
        assert rt.observe(twin).same_as(obs)
        assert _solve(rt, env).success and _solve(rt, twin).success
        rt.close(twin)
    finally:
        rt.shutdown()
    assert not _running_containers(CONTAINER_NAME_PREFIX)
