"""The code environment: a Python repository in a `--network none` container, a shell and a
file editor as tools, and the repository's own tests as the judge.

    env = CodeEnvironment(CodeEnvConfig())
    start = await env.reset(task)                          # a CodeTask (cua_jax.tasks.code_tasks)
    step = await env.step(parse_code_action(reply))        # bash / str_replace_editor / submit
    ...                                                    # submit: the judge runs, the episode ends
    await env.end_episode(); await env.close()

The container (image `code`, launch/images/code/) runs read-only but for two size-capped
tmpfs mounts, the work tree /work (the repository is /work/repo) and /tmp: dockerd's overlay2
here cannot cap a container's disk, a tmpfs can. Memory (no swap) and the number of processes
are capped too. Its PID 1 is the runner's reaper; every tool call is one `docker exec` of the
runner (launch/images/code/runner.py), which runs a command in a session of its own and
kills the whole session at its timeout.

Faults: a step whose command hit the memory limit (an OOM kill in the container's cgroup),
the process limit (a fork refused) or filled the work tree, or whose container died or
stopped answering, quarantines the episode (EnvTransition.fault); the container is then
replaced before the next episode. Nothing else is affected: each container has its own caps.

The judge (on submit) scores only the fix: the repository's tests run on a pristine copy, the
clean repository with the task's bug and the agent's versions of the package's source files
(`CodePackage.sources`), under a pytest that nothing in the work tree can configure. Everything
else the agent changed is left out of the verdict and listed in the episode's info:
`changes_outside_sources` (the first 50 paths) and `changes_outside_sources_count`.
launch/images/code/runner.py says how, and what it cannot rule out.

Reset modes: "pooled" keeps the container between episodes and resets it to a clean tree
(every process killed, /work and /tmp emptied, the repository copied afresh); "fresh" starts
a new container for every episode (the baseline experiments/benchmarks/code_env.py compares).

Actions are Qwen tool calls (`code_actions.parse_code_action`):

    <tool_call>{"name": "bash", "arguments": {"command": "pytest -x -q", "timeout": 60}}</tool_call>
    <tool_call>{"name": "str_replace_editor", "arguments": {"command": "str_replace",
        "path": "toolz/itertoolz.py", "old_str": "...", "new_str": "..."}}</tool_call>
    <tool_call>{"name": "submit", "arguments": {}}</tool_call>
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import re
import time
import uuid
from typing import Any

import docker
import docker.errors
import requests.exceptions

from cua_jax.envs import actions as A
from cua_jax.envs.code_actions import (
    SYSTEM_PROMPT,
    Bash,
    CodeAction,
    Edit,
    Submit,
    parse_code_action,
)
from cua_jax.envs.contract import (
    AgentEnvironment,
    EnvObservation,
    EnvReset,
    EnvTransition,
    TaskIsGroupStart,
)
from cua_jax.envs.docker_exec import exec_run
from cua_jax.envs.faults import (
    AttributedFaultError,
    Attribution,
    Fault,
    FaultKind,
    Outcome,
    container_fault,
    episode_outcome,
)
from cua_jax.envs.images import ensure_image
from cua_jax.tasks.code_tasks import CodeTask, judge_request, verdict

log = logging.getLogger(__name__)

LABEL = "cua-jax.code-env"
RUNNER = "/opt/cua/runner.py"
REPO = "/work/repo"
RESET_MODES = ("pooled", "fresh")

# ---------------------------------------------------------------------------------------
# Observations
# ---------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def escape_output(data: bytes) -> str:
    """Bytes as readable text: UTF-8 where valid, every other byte and every control
    character but newline and tab as a \\xNN escape."""
    text = data.decode("utf-8", errors="backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def stream_text(head: bytes, tail: bytes, total: int) -> str:
    """One captured stream (its first bytes, last bytes and total length) as text, with a
    visible marker where the middle was cut."""
    cut = total - len(head) - len(tail)
    if cut <= 0:
        return escape_output(head + tail)
    return f"{escape_output(head)}\n[... {cut} bytes truncated ...]\n{escape_output(tail)}"


def bash_observation(result: dict, timeout: float) -> str:
    def stream(name: str) -> str:
        part = result[name]
        return stream_text(base64.b64decode(part["head"]), base64.b64decode(part["tail"]), part["total"])

    if result["timed_out"]:
        status = f"killed: the command ran past its timeout of {timeout:g} s (exit code {result['exit_code']})"
    else:
        status = f"exit code: {result['exit_code']}"
    return f"{status}\nstdout:\n{stream('stdout')}\nstderr:\n{stream('stderr')}"


# ---------------------------------------------------------------------------------------
# The container
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class CodeEnvConfig:
    """How the code environment runs its container.

    image: the image tag (None: `image_tag("code")`, built when missing).
    cpus / memory / pids_limit: the container's caps (memory without swap).
    work_size / tmp_size: the tmpfs caps of the work tree /work and of /tmp.
    default_timeout / max_timeout: a bash call's timeout when it names none, and its ceiling.
    output_limit: bytes of each stream shown (the first and last halves).
    work_free_min: bytes left on the work tree under which it counts as filled (a fault).
    reset_mode: "pooled" (one container, reset to a clean tree) or "fresh" (a new container
        per episode).
    partial_credit: reward the fraction of fail-to-pass tests that pass (when nothing broke).
    max_turns: the environment's own step budget (None: the agent loop's budget alone).
    docker_timeout: seconds a Docker API call may take beyond the work it waits for.
    """

    image: str | None = None
    cpus: float = 1.0
    memory: str = "512m"
    pids_limit: int = 128
    work_size: str = "64m"
    tmp_size: str = "16m"
    default_timeout: float = 30.0
    max_timeout: float = 300.0
    output_limit: int = 8000
    work_free_min: int = 256 * 1024
    reset_mode: str = "pooled"
    partial_credit: bool = False
    max_turns: int | None = None
    docker_timeout: float = 60.0

    def __post_init__(self):
        if self.reset_mode not in RESET_MODES:
            raise ValueError(f"reset_mode {self.reset_mode!r} is not one of {RESET_MODES}")
        for name in ("cpus", "pids_limit", "default_timeout", "max_timeout", "output_limit", "docker_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("memory", "work_size", "tmp_size"):  # Docker's sizes: bytes, or a number with b, k, m or g
            if re.fullmatch(r"[1-9][0-9]*[bkmg]?", str(getattr(self, name))) is None:
                raise ValueError(f"{name} {getattr(self, name)!r} is not a size such as '512m'")
        if self.max_timeout < self.default_timeout:
            raise ValueError(f"max_timeout {self.max_timeout} is below default_timeout ({self.default_timeout})")


class ContainerFault(AttributedFaultError):
    """A fault of the container (its state, a limit it hit, a runner that failed): the
    contract's fault rule takes `fault` as is."""


_DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, ConnectionError)


class CodeContainer:
    """One code container and the runner calls into it."""

    def __init__(self, config: CodeEnvConfig, image: str, client: docker.DockerClient | None = None):
        self.config = config
        self.image = image
        self.client = client or docker.from_env(timeout=int(config.docker_timeout + config.max_timeout))
        self.name = f"cua-jax-code-{uuid.uuid4().hex[:10]}"
        self.id: str | None = None

    def start(self) -> CodeContainer:
        cfg = self.config
        try:
            container = self.client.containers.run(
                self.image,
                name=self.name,
                detach=True,
                labels={LABEL: "1"},
                network_mode="none",
                read_only=True,
                tmpfs={"/work": f"size={cfg.work_size},mode=1777", "/tmp": f"size={cfg.tmp_size},mode=1777"},
                nano_cpus=int(cfg.cpus * 1e9),
                mem_limit=cfg.memory,
                memswap_limit=cfg.memory,
                pids_limit=cfg.pids_limit,
            )
        except _DOCKER_ERRORS as error:
            raise ContainerFault(Fault(FaultKind.SETUP_FAILED, f"cannot start {self.image}: {error}")) from None
        self.id = container.id
        return self

    def state_fault(self) -> Fault | None:
        try:
            return container_fault(self.client.api.inspect_container(self.id)["State"])
        except docker.errors.NotFound:
            return container_fault(None)
        except _DOCKER_ERRORS as error:
            return Fault(FaultKind.SERVER_UNRESPONSIVE, f"docker cannot inspect {self.name}: {error}")

    def call(self, request: dict) -> dict:
        """Run one runner request; its JSON answer. ContainerFault when the runner could not
        answer (the container died, a fork was refused, the runner was OOM-killed)."""
        payload = base64.b64encode(json.dumps(request).encode()).decode()
        try:
            # -I: the agent's tree is on the image's PYTHONPATH and under HOME; none of it may load
            # into the runner (a sitecustomize.py, a .pth file)
            result = exec_run(self.client.api, self.id, ["python3", "-I", RUNNER, payload])
        except _DOCKER_ERRORS as error:
            raise ContainerFault(
                self.state_fault() or Fault(FaultKind.SERVER_UNRESPONSIVE, f"{request['op']}: {error}")
            ) from None
        if result.returncode == 0 and result.stdout:
            try:
                return json.loads(result.stdout.decode())
            except ValueError:
                pass
        detail = (result.stderr + result.stdout).decode(errors="replace").strip()[-500:] or "no output"
        raise ContainerFault(
            self.state_fault()
            or Fault(
                FaultKind.SERVER_ERROR, f"the runner's {request['op']} failed (exit {result.returncode}): {detail}"
            )
        )

    def remove(self) -> None:
        if self.id is None:
            return
        try:
            self.client.api.remove_container(self.id, force=True)
        except docker.errors.NotFound:
            pass
        except _DOCKER_ERRORS as error:
            log.warning("cannot remove %s: %s", self.name, error)
        self.id = None


def limit_fault(before: dict, after: dict, work_free_min: int) -> Fault | None:
    """The resource limit a call hit, from the runner's counters before and after it."""
    if after["oom_kills"] > before["oom_kills"]:
        return Fault(
            FaultKind.OOM_KILLED,
            f"{after['oom_kills'] - before['oom_kills']} process(es) killed at the container's memory limit",
        )
    if after["pids_max_hits"] > before["pids_max_hits"]:
        return Fault(
            FaultKind.PROCESS_LIMIT,
            f"the container's pids limit refused {after['pids_max_hits'] - before['pids_max_hits']} fork(s)",
        )
    if 0 <= after["work_free_bytes"] < work_free_min:
        return Fault(FaultKind.WORK_TREE_FULL, f"{after['work_free_bytes']} bytes left on the size-capped tmpfs")
    return None


# ---------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------


class CodeEpisode:
    """One blocking episode of a code task in `container` (reset to the task's buggy tree)."""

    def __init__(self, env: CodeEnvironment, task: CodeTask):
        self.env, self.task = env, task
        self.turns = 0
        self.baseline: dict | None = None
        self.outcome: Outcome | None = None
        self.fault: Fault | None = None
        self.judge_seconds: float | None = None
        self.info: dict[str, Any] = {}

    def _call(self, request: dict) -> dict:
        answer = self.env.container.call(request)
        fault = limit_fault(self.baseline, answer["limits"], self.env.config.work_free_min) if self.baseline else None
        if fault is not None:
            raise ContainerFault(fault)
        return answer

    def start(self) -> None:
        answer = self.env.container.call(
            {"op": "reset", "package": self.task.package, "hunks": [h.to_json() for h in self.task.bug]}
        )
        if not answer["ok"]:
            raise ContainerFault(Fault(FaultKind.SETUP_FAILED, answer["error"]))
        self.baseline = answer["limits"]

    def perform(self, action: CodeAction | A.InvalidAction) -> tuple[str | None, Outcome | None]:
        """(the observation text, or None once the episode ended; its outcome once ended)."""
        cfg = self.env.config
        self.turns += 1
        try:
            if isinstance(action, A.InvalidAction):
                text = f"Invalid action: {action.message}"
            elif isinstance(action, Submit):
                return None, self._judge()
            elif isinstance(action, Bash):
                timeout = min(action.timeout or cfg.default_timeout, cfg.max_timeout)
                answer = self._call(
                    {"op": "bash", "command": action.command, "timeout": timeout, "limit": cfg.output_limit}
                )
                text = bash_observation(answer, timeout) if answer["ok"] else f"Action failed: {answer['error']}"
            elif isinstance(action, Edit):
                request = {"op": "edit", **{k: v for k, v in dataclasses.asdict(action).items() if v is not None}}
                answer = self._call(request)
                text = answer["output"] if answer["ok"] else f"Action failed: {answer['error']}"
            else:
                text = f"Invalid action: {type(action).__name__} is no action of the code environment"
        except ContainerFault as error:
            return None, self._end(fault=error.fault)
        if cfg.max_turns is not None and self.turns >= cfg.max_turns:
            return None, self._end(budget_exhausted=True)
        return text, None

    def _judge(self) -> Outcome:
        task = self.task
        started = time.monotonic()
        try:
            answer = self._call(judge_request(task.package, task.bug, task.test_files, task.timeout))
        except ContainerFault as error:
            return self._end(fault=error.fault)
        self.judge_seconds = time.monotonic() - started
        # What the agent changed besides the package's sources: never judged, always reported.
        self.info = {
            "changes_outside_sources": list(answer.get("changes_outside_sources", [])),
            "changes_outside_sources_count": answer.get("changes_outside_sources_count", 0),
            "judge_seconds": self.judge_seconds,
        }
        # Nothing to test (CANOPY App. H's terminal states, scored by the attribution rule's
        # constants): no change to the sources, a change that cannot be carried over, a test
        # run that hangs or crashes pytest.
        if answer.get("changed_sources_count") == 0:
            return self._end(no_patch="no patch: the agent changed none of the package's sources")
        if not answer["ok"]:
            if answer.get("stage") == "carry":
                return self._end(no_patch=f"the patch does not apply: {answer['error']}")
            return self._end(crash=answer["error"])
        result = verdict(task, answer["outcomes"], self.env.config.partial_credit)
        self.info.update(
            {
                "fail_to_pass_passed": result.fail_to_pass_passed,
                "fail_to_pass_total": result.fail_to_pass_total,
                "broken": list(result.broken[:20]),
            }
        )
        return self._end(verdict=result.reward)

    def _end(self, **kwargs) -> Outcome:
        self.fault = kwargs.get("fault")
        if self.fault is not None:
            log.warning("code episode of %s quarantined: %s", self.task.id, self.fault.reason)
        self.outcome = episode_outcome(rule=self.env.attribution, **kwargs)
        return self.outcome


class CodeEnvironment(TaskIsGroupStart, AgentEnvironment):
    """Code tasks (`CodeTask`) in one container of their own (module doc). Its tools are its
    own: the agent loop shows `SYSTEM_PROMPT` and reads replies with `parse_code_action`."""

    system_prompt = SYSTEM_PROMPT

    def parse_action(self, text: str, action_space: str) -> CodeAction | A.InvalidAction:
        return parse_code_action(text)  # no pointer: the action space does not apply

    def __init__(self, config: CodeEnvConfig | None = None, *, attribution: Attribution = Attribution()):
        self.config = config or CodeEnvConfig()
        self.attribution = attribution
        self.container: CodeContainer | None = None
        self.episode: CodeEpisode | None = None
        self._broken = False
        self._image: str | None = self.config.image
        self.counters = {"containers_started": 0, "resets": 0, "quarantined": 0}

    @property
    def image(self) -> str:
        if self._image is None:
            self._image = ensure_image("code")
        return self._image

    # ---- blocking work, run in threads ----------------------------------------------------
    def _new_container(self) -> None:
        if self.container is not None:
            self.container.remove()
        self.container = None
        container = CodeContainer(self.config, self.image).start()
        self.container = container
        self.counters["containers_started"] += 1
        self._broken = False

    def _start(self, task: CodeTask) -> CodeEpisode:
        if not isinstance(task, CodeTask):
            raise ValueError(f"the code environment runs CodeTask, got {type(task).__name__}")
        if self.container is None or self._broken or self.config.reset_mode == "fresh":
            self._new_container()
        episode = CodeEpisode(self, task)
        try:
            episode.start()
        except ContainerFault:
            self._broken = True
            raise
        self.counters["resets"] += 1
        return episode

    def _after(self, episode: CodeEpisode) -> None:
        if episode.fault is not None:
            self._broken = True
            self.counters["quarantined"] += 1

    # ---- the contract -------------------------------------------------------------------
    async def _reset(self, task: Any, seed: int | None) -> EnvReset:
        await self.end_episode()
        # A container that could not start is gone (`_new_container`): the next reset starts another.
        self.episode = await asyncio.to_thread(self._start, task)
        text = f"The repository is checked out at {REPO}. Fix the issue, then submit."
        return EnvReset(task.instruction, EnvObservation((), text), screen_size=A.DEFAULT_SCREEN_SIZE)

    async def _step(self, action: Any) -> EnvTransition:
        episode = self.episode
        if episode is None or episode.outcome is not None:
            raise RuntimeError("step() without a running episode (reset first)")
        text, outcome = await asyncio.to_thread(episode.perform, action)
        if outcome is None:
            return EnvTransition(EnvObservation((), text))
        self._after(episode)
        return EnvTransition(None, outcome.reward, outcome, info=dict(episode.info), fault=episode.fault)

    async def end_episode(self) -> None:
        self.episode = None
        if self.config.reset_mode == "fresh" and self.container is not None:
            await asyncio.to_thread(self.container.remove)
            self.container = None

    async def close(self) -> None:
        self.episode = None
        if self.container is not None:
            await asyncio.to_thread(self.container.remove)
            self.container = None
