"""Judge code run in a desktop container from the host, past everything the agent can change.

The agent of a desktop task drives a shell in its container, often as root (the plain desktop
image runs as root; the osworld image's user has sudo). What the environment's server runs is
therefore under the agent's control: it can plant a `sitecustomize.py` on the image's
PYTHONPATH (/opt/cua), a `.pth` file in a site directory, a `python3` earlier on PATH, or
replace the server itself. So a judge's Python does not go through the server:
`ContainerJudge.run_python` is one `docker exec` from the host (`docker_exec.exec_run`, which
reads all of a short judge's output) of `judge_mount/run_judge.py`, bind-mounted read-only at
`JUDGE_MOUNT` when the pool creates the container (the container cannot remount it), under
`/usr/bin/python3 -I -S` with a fixed PATH. The reply has the fields of the server's
/run_python (status, output, error, returncode).

What root in the container can still alter, and this does not close (docs/reliability.md, "Reward
integrity"): the interpreter binary and the standard library in the image's writable layer,
the system's dist-packages directories (appended after the standard library, without their
.pth files), and the judge process itself from a process the agent left running (same uid:
it can read the judge's arguments and write to its output). `metrics.general.run_python_judge`
therefore marks its verdict with a fresh nonce per run and refuses an output with more than
one verdict.
"""

from __future__ import annotations

import base64
import json
import pathlib
from collections.abc import Callable
from typing import Any

import docker.errors
import requests

from cua_jax.envs.docker_exec import exec_run

JUDGE_MOUNT = "/opt/cua-judge"  # where the pool mounts judge_mount/, read-only
HOST_JUDGE_DIR = pathlib.Path(__file__).resolve().parent / "judge_mount"
RUNNER = f"{JUDGE_MOUNT}/run_judge.py"
# Never a PATH directory the agent can write first: the judge's own subprocesses (xdotool,
# pgrep) resolve through these, which only root can change.
JUDGE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
INTERPRETER = "/usr/bin/python3"
# How much longer than the judge's own timeout (after which the runner kills it) the host waits
# for the exec's output.
READ_MARGIN_S = 30.0


class JudgeError(RuntimeError):
    """The judge could not reach a verdict through no fault of the agent."""


class JudgeTamperedError(JudgeError):
    """The judge's output holds a verdict the judge did not write: the agent's doing (a process
    it left running in the environment wrote to the judge's output)."""


def judge_volume() -> dict[str, dict[str, str]]:
    """The docker SDK `volumes` entry that mounts the runner read-only."""
    return {str(HOST_JUDGE_DIR): {"bind": JUDGE_MOUNT, "mode": "ro"}}


class ContainerJudge:
    """Runs judge code in one container by `docker exec` (see the module docstring).

    docker: a function returning a docker SDK client for the calling thread (the SDK's HTTP
    session is not meant to be shared); container_id: the container, created with `judge_volume()`.
    """

    def __init__(self, docker: Callable[[], Any], container_id: str):
        self.docker = docker
        self.container_id = container_id

    def run_python(self, code: str, timeout: float = 60.0) -> dict[str, Any]:
        payload = base64.b64encode(json.dumps({"code": code, "timeout": timeout}).encode()).decode()
        try:
            result = exec_run(
                self.docker().api,
                self.container_id,
                [INTERPRETER, "-I", "-S", RUNNER, payload],
                environment={"PATH": JUDGE_PATH},
                user="root",
                timeout=timeout + READ_MARGIN_S,
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
            # the episode's finish asks the pool why (a container that exited says so)
            raise JudgeError(f"the judge's docker exec failed: {error}") from None
        output = result.stdout.decode(errors="replace")
        error = result.stderr.decode(errors="replace")
        reply: dict[str, Any] = {"status": "success", "output": output, "error": error, "returncode": result.returncode}
        if result.returncode == 124 and "judge timed out" in error:
            reply.update(status="error", message=f"the judge timed out after {timeout:g}s")
        return reply
