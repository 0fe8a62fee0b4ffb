"""A two-node Ray cluster on this machine for the launch tests: a head (1 CPU, with the job
dashboard) and a second node (2 CPUs) that alone advertises the custom resource
`rollout_node`, as a rollout machine of a real cluster would."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

ROLLOUT_RESOURCE = "rollout_node"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.fixture(scope="session")
def ray_cluster():
    """{"address": GCS host:port, "dashboard": job API URL, "env": the environment to reach it}."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    temp_dir = tempfile.mkdtemp(prefix="rl", dir="/tmp")  # Ray's socket paths must stay short
    gcs_port, dashboard_port = free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    commands = [
        [
            ray_bin,
            "start",
            "--head",
            f"--port={gcs_port}",
            f"--dashboard-port={dashboard_port}",
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
