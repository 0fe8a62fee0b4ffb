"""What the launch tests share: a two-node Ray cluster on this machine (a head with 1 CPU and
the job dashboard, and a second node with 2 CPUs that alone advertises the custom resource
`rollout_node`, as a rollout machine of a real cluster would), free ports, and the environment
and flags of the multi-host tests' processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

ROLLOUT_RESOURCE = "rollout_node"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The multi-host trainer tests' policy: the tiny text Qwen3 on DOM text, each request with its
# own sampling stream (a group samples the same tokens whichever process runs it), coordinated.
TEXT_POLICY_FLAGS = [
    "--config=experiments/configs/tiny.py",
    "--config.model.name=tiny_qwen3",
    "--config.env.observation=text",
    "--config.env.include_dom_text=true",
    "--config.rollout.seed_per_turn=true",
    "--config.rollout.max_context_tokens=2048",
    "--config.rollout.prompt_style=compact",
    "--config.train.coordinated=true",
]
# The same on screenshots: the tiny vision-language Qwen3-VL (tiny.py's policy) on the page's
# pixels, whose images every process's rows of a global micro-batch carry.
SCREENSHOT_POLICY_FLAGS = [
    "--config=experiments/configs/tiny.py",
    "--config.model.name=tiny_qwen3_vl",
    "--config.env.observation=screenshot",
    "--config.rollout.seed_per_turn=true",
    "--config.train.coordinated=true",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(devices: int, **extra: str) -> dict[str, str]:
    """The environment of a multi-host test's process: `devices` CPU devices, this repository
    importable, launch/multihost.sh's Python this one, and `extra` (CUA_PROCESS_ID, ...)."""
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "CUA_JAX_PYTHON": sys.executable,
        **extra,
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    return env


def _stop_ray_processes(temp_dir: str) -> None:
    """Stops the processes of the nodes started here: every process group holding a process
    whose command line names this cluster's temp dir."""
    pids = subprocess.run(["pgrep", "-f", temp_dir], capture_output=True, text=True).stdout.split()
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(int(pid)))
        except ProcessLookupError:
            pass
    for group in groups - {os.getpgid(0)}:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def driver_auth_mode(mode: str):
    """This process as a Ray driver in the cluster's authentication mode. A local ray.init()
    earlier in the process (another test's) switches the process to token mode, and a driver
    in token mode rejects the calls of a cluster without tokens: its actors are then reported
    dead before they start."""
    from ray._raylet import AuthenticationTokenLoader, Config

    def reread() -> None:  # Ray caches the mode and the token it read; both are re-read
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()

    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = mode
    reread()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAY_AUTH_MODE")
        else:
            os.environ["RAY_AUTH_MODE"] = before
        reread()


@pytest.fixture(scope="session")
def ray_cluster():
    """{"address": GCS host:port, "dashboard": job API URL, "env": the environment to reach it}."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    temp_dir = tempfile.mkdtemp(prefix="rl", dir="/tmp")  # Ray's socket paths must stay short
    gcs_port, dashboard_port = free_port(), free_port()
    # Each node's job agent gets a port of its own: at Ray's default (52365) the agent of a second
    # Ray on the machine (another test worker's) cannot listen, and jobs find no agent.
    agent_ports = free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    commands = [
        [
            ray_bin,
            "start",
            "--head",
            f"--port={gcs_port}",
            f"--dashboard-port={dashboard_port}",
            f"--dashboard-agent-listen-port={agent_ports[0]}",
            "--num-cpus=1",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
        ],
        [
            ray_bin,
            "start",
            f"--address=127.0.0.1:{gcs_port}",
            f"--dashboard-agent-listen-port={agent_ports[1]}",
            "--num-cpus=2",
            f'--resources={{"{ROLLOUT_RESOURCE}": 2}}',
            "--disable-usage-stats",
        ],
    ]
    try:
        for command in commands:
            started = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=120, start_new_session=True
            )
            assert started.returncode == 0, started.stdout + started.stderr
        yield {"address": f"127.0.0.1:{gcs_port}", "dashboard": f"http://127.0.0.1:{dashboard_port}", "env": env}
    finally:
        _stop_ray_processes(temp_dir)
