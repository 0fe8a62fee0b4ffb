"""The policies an evaluation runs, and the rollout workers that run them.

  policy = load_eval_policy("random", config)            # or "oracle", an HF directory,
                                                         # or a training run's workdir (+ step)
  make_workers = worker_factory(policy, suite, num_workers=2, group_size=k)
  workers = make_workers(15, 1.0)                        # turn budget, temperature

random   `RandomActionEngine`: a uniformly random action of the action grammar each turn
         (clicks anywhere on the grid, a short typed word, a key, a scroll), seeded by the
         request's own sampling seed, so a rerun replays it
noop     `NoOpEngine`: declares the task done on its first turn (the floor an untouched
         environment scores: a task it passes is judged on a state it did not change)
oracle   the scripted MiniWoB oracle through `OracleDemonstrator` (`TaskOracleEngine`: one
         per task, the harness names the task before each group); a web application task's
         recorded solution (its suite's validation.json), replayed turn by turn (needs
         env.action_space "elements" or "both"); a desktop task's scripted solution (its
         suite's solutions.py, `SOLUTIONS`: the os and apps suites); tasks without any are
         skipped with the reason
a directory holding a Hugging Face policy: loaded as model.init_from
a training run's workdir (it holds checkpoints/): checkpoint `step` (default the latest), its
         own config, as `experiments.export` reads and restores it
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cua_jax.context.render import ChatRenderer
from cua_jax.context.tokenizer import load_processor
from cua_jax.environments.kinds import environment_kind
from cua_jax.envs import actions as A
from cua_jax.envs.miniwob_oracle import ORACLE_TASKS
from cua_jax.models.checkpoint import read_hf_config
from cua_jax.models.hf_policy import check_policy_directory
from cua_jax.rollout.agent_loop import AgentConfig, reserved_token_ids
from cua_jax.rollout.engine import (
    FinishReason,
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingConfig,
    ScriptedEngine,
)
from cua_jax.rollout.oracle_engine import OracleDemonstrator
from cua_jax.rollout.rollout_worker import EnvWrapper
from cua_jax.train.build import (
    build_policy,
    build_rollout_workers,
    load_run_processor,
    rollout_worker_config,
    start_local_workers,
)
from cua_jax.train.checkpoint import resolve_step, restore_policy
from cua_jax.train.settings import TrainSettings
from experiments.export import read_run_config
from experiments.sweep_runs import apply_overrides

SCRIPTED_POLICIES = ("random", "noop", "oracle")
ASSISTANT_TURN = "<|im_start|>assistant"  # ChatML's opening of an assistant turn (the shipped tokenizer's)
RANDOM_KEYS = ("enter", "tab", "backspace", "esc", "up", "down", "left", "right", "space")
RANDOM_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def random_action(rng: np.random.Generator) -> A.Action:
    """One of five action kinds, chosen uniformly, with uniform arguments: a left / double /
    right click at a grid point, typing a 1-8 letter word, a key, a scroll of 1-5 notches."""
    kind = int(rng.integers(5))
    if kind < 3:
        x, y = (int(v) for v in rng.integers(0, A.GRID + 1, size=2))
        return A.Click(("left_click", "double_click", "right_click")[kind], x, y)
    if kind == 3:
        if rng.integers(2):
            return A.Key((RANDOM_KEYS[int(rng.integers(len(RANDOM_KEYS)))],))
        return A.Type("".join(rng.choice(list(RANDOM_LETTERS), size=int(rng.integers(1, 9)))))
    return A.Scroll(A.SCROLL_DIRECTIONS[int(rng.integers(4))], int(rng.integers(1, 6)))


def reply_ids(tokenizer, text: str, end_of_turn_id: int) -> np.ndarray:
    """int32 [T]: a scripted reply's tokens and the end-of-turn token."""
    return np.asarray([*tokenizer.encode(text, add_special_tokens=False), int(end_of_turn_id)], np.int32)


def scripted_generation(ids: np.ndarray, sampling: SamplingConfig) -> Generation:
    """A scripted reply `ids` as a generation (logprobs 0), cut at sampling.max_new_tokens as a
    policy's reply would be."""
    finish = FinishReason.STOP
    if len(ids) > sampling.max_new_tokens:
        ids, finish = ids[: sampling.max_new_tokens], FinishReason.LENGTH
    return Generation(ids, np.zeros(len(ids), np.float32), finish, 0)


class RandomActionEngine(ScriptedEngine):
    """Answers every request with `random_action`'s tool call plus the end-of-turn token
    (logprob 0), drawn from the request's seed (else the engine's own stream, seeded `seed`).
    A reply longer than max_new_tokens is cut there, as a policy's would be."""

    name = "the random policy"

    def __init__(self, tokenizer, end_of_turn_id: int, seed: int = 0):
        self.tokenizer = tokenizer
        self.end_of_turn_id = int(end_of_turn_id)
        self.rng = np.random.default_rng(seed)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        out = []
        for request in requests:
            rng = np.random.default_rng(request.seed) if request.seed is not None else self.rng
            ids = reply_ids(self.tokenizer, A.render_action(random_action(rng)), self.end_of_turn_id)
            out.append(scripted_generation(ids, sampling))
        return out


class NoOpEngine(ScriptedEngine):
    """Answers every request with `done` plus the end-of-turn token (logprob 0): the episode
    ends on its first turn, with the environment as its setup left it."""

    name = "the no-op policy"

    def __init__(self, tokenizer, end_of_turn_id: int):
        self.ids = reply_ids(tokenizer, A.render_action(A.Done()), end_of_turn_id)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        return [scripted_generation(self.ids, sampling) for _ in requests]


class TaskOracleEngine(ScriptedEngine):
    """The MiniWoB oracle for whichever task `task` names (set before each group), through one
    `OracleDemonstrator` per task; the oracle's messages for pages it could not read collect in
    `errors`."""

    name = "the oracle"

    def __init__(
        self, tokenizer, end_of_turn_id: int, action_space: str, replays: dict[str, tuple[str, ...]] | None = None
    ):
        self.tokenizer = tokenizer
        self.end_of_turn_id = int(end_of_turn_id)
        self.action_space = action_space
        self.task: str | None = None
        self.demonstrators: dict[str, Any] = {}
        self.replays = dict(replays or {})  # task -> its recorded solution's replies, turn by turn
        self.replay_errors: list[str] = []

    def _replay(self, request: GenerationRequest, sampling: SamplingConfig) -> Generation:
        """The recorded solution's reply for this turn: the turn is the number of assistant turns
        the prompt already holds. Past the recording (or a reply too long to write), FAIL."""
        prompt = self.tokenizer.decode(request.prompt_ids.tolist(), skip_special_tokens=False)
        turn = prompt.count(ASSISTANT_TURN) - 1  # the last one is the turn being generated
        replies = self.replays[self.task]
        text = replies[turn] if 0 <= turn < len(replies) else A.render_action(A.Fail())
        if not 0 <= turn < len(replies):
            self.replay_errors.append(f"{self.task}: turn {turn} is past its recorded solution's {len(replies)}")
        ids = reply_ids(self.tokenizer, text, self.end_of_turn_id)
        if len(ids) > sampling.max_new_tokens:
            self.replay_errors.append(f"{self.task}: the recorded reply has {len(ids)} tokens, over max_new_tokens")
            ids = reply_ids(self.tokenizer, A.render_action(A.Fail()), self.end_of_turn_id)
        return Generation(ids, np.zeros(len(ids), np.float32), FinishReason.STOP, 0)

    @property
    def errors(self) -> list[str]:
        return [e for d in self.demonstrators.values() for e in d.errors] + self.replay_errors

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        if self.task is None:
            raise RuntimeError("the oracle engine was not told its task (TaskOracleEngine.task) before the group")
        if self.task in self.replays:
            return [self._replay(request, sampling) for request in requests]
        if self.task not in self.demonstrators:
            self.demonstrators[self.task] = OracleDemonstrator(
                self.tokenizer, self.end_of_turn_id, self.task, reasoning=False, action_space=self.action_space
            )
        return self.demonstrators[self.task].generate(requests, sampling)


@dataclasses.dataclass(frozen=True)
class ScriptedEngineFactory:
    """Builds a scripted policy's engine ("random", "noop" or "oracle") with the tokenizer in
    `tokenizer_dir` (None: the shipped one)."""

    kind: str
    tokenizer_dir: str | None = None
    seed: int = 0
    action_space: str = "coordinates"
    replays: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (task, its recorded solution's replies)

    def __call__(self) -> RolloutEngine:
        renderer = ChatRenderer(*load_processor(self.tokenizer_dir))
        if self.kind == "random":
            return RandomActionEngine(renderer.tokenizer, renderer.end_of_turn_id, self.seed)
        if self.kind == "noop":
            return NoOpEngine(renderer.tokenizer, renderer.end_of_turn_id)
        return TaskOracleEngine(renderer.tokenizer, renderer.end_of_turn_id, self.action_space, dict(self.replays))


@dataclasses.dataclass
class EvalPolicy:
    """What an evaluation runs. name: how tables and folders name it; config: the run config
    whose agent, observation and context settings the workers follow; model: the policy
    network (None for scripted ones); step: the checkpoint it came from (a run's workdir)."""

    name: str
    config: Any
    model: Any = None
    step: int | None = None

    @property
    def scripted(self) -> bool:
        return self.model is None

    @property
    def per_task(self) -> bool:
        """Whether the engine must be told each group's task (`bind`): one group per call then."""
        return self.name == "oracle"

    def unsupported(self, task: Any) -> str | None:
        """Why this policy cannot run `task` (a `SourceTask`), or None."""
        if self.name == "oracle":
            if task.kind == "webapp":
                if task.task_id not in webapp_replays([task]):
                    return "its suite's validation.json records no solution for it"
            elif task.kind == "desktop":
                if task.task_id not in desktop_replays([task]):
                    return "its suite has no scripted solution for it (a solutions.py with SOLUTIONS)"
            elif task.kind != "miniwob" or task.spec not in ORACLE_TASKS:
                return "the MiniWoB oracle has no script for it"
            elif not self.config.env.include_dom_text:
                return "the MiniWoB oracle reads the page from the prompt: set config.env.include_dom_text=True"
        return None

    def bind(self, worker: Any, task_id: str) -> None:
        """Tells the worker's engine which task its next group runs (the oracle needs it)."""
        if self.name == "oracle":
            worker.engine.task = task_id


def webapp_replays(tasks: Sequence[Any]) -> dict[str, tuple[str, ...]]:
    """The recorded solutions (`cua_jax.envs.webapp.script`) of the web application tasks among
    `tasks` (`SourceTask`s), read from each task's folder's validation.json: the oracle replays
    them turn by turn (the seeded state and the pages' element ids are deterministic)."""
    from cua_jax.envs.webapp.script import demonstrations

    folders = {str(pathlib.Path(task.origin).parent) for task in tasks if task.kind == "webapp"}
    recorded = {task: replies for folder in sorted(folders) for task, replies in demonstrations(folder).items()}
    return {task.task_id: recorded[task.task_id] for task in tasks if task.task_id in recorded}


def desktop_replays(tasks: Sequence[Any]) -> dict[str, tuple[str, ...]]:
    """The scripted solutions of the desktop tasks among `tasks` (`SourceTask`s) whose folder is
    one of the project's suites with a solutions module (`cua_jax.tasks.suites.<name>.solutions`,
    its SOLUTIONS: task id -> the replies, turn by turn)."""
    import importlib

    from cua_jax.eval.suites import SUITES_DIR

    out = {}
    for task in tasks:
        if task.kind != "desktop":
            continue
        folder = pathlib.Path(task.origin).resolve().parent
        if folder.parent != SUITES_DIR.resolve() or not (folder / "solutions.py").is_file():
            continue
        solutions = importlib.import_module(f"cua_jax.tasks.suites.{folder.name}.solutions").SOLUTIONS
        if task.task_id in solutions:
            out[task.task_id] = tuple(solutions[task.task_id])
    return out


def oracle_replays(tasks: Sequence[Any]) -> dict[str, tuple[str, ...]]:
    """What the oracle replays turn by turn among `tasks`: web application tasks' recorded
    solutions and desktop tasks' scripted ones."""
    return {**webapp_replays(tasks), **desktop_replays(tasks)}


def _check_scripted_config(name: str, config: Any) -> None:
    if name == "random" and config.env.action_space == "elements":
        raise ValueError(
            "--policy random emits grid actions; config.env.action_space 'elements' refuses them "
            "(use 'coordinates' or 'both')"
        )
    if name == "oracle" and config.env.observation != "screenshot":
        raise ValueError(
            "--policy oracle answers screenshot observations: it needs config.env.observation='screenshot'"
        )


def load_eval_policy(spec: str, config: Any, step: int | None = None) -> EvalPolicy:
    """The policy `spec` names: "random", "oracle", a Hugging Face policy directory (loaded as
    model.init_from over `config`), or a training run's workdir (checkpoint `step`, default the
    latest, with the run's own config). Anything else raises, naming what was expected."""
    if spec in SCRIPTED_POLICIES:
        if step is not None:
            raise ValueError(f"--step applies to a run's workdir, not to --policy {spec}")
        _check_scripted_config(spec, config)
        return EvalPolicy(spec, config)
    path = pathlib.Path(spec)
    if not path.is_dir():
        raise ValueError(
            f"--policy {spec!r} is neither one of {SCRIPTED_POLICIES} nor a directory (a Hugging Face "
            "policy or a training run's workdir)"
        )
    if (path / "checkpoints").is_dir():
        step = resolve_step(path, step)
        run_config = read_run_config(path, step)
        return EvalPolicy(
            f"{path.name}@{step}", run_config, restore_policy(path, step, TrainSettings.from_config(run_config)), step
        )
    if step is not None:
        raise ValueError(f"--step applies to a run's workdir; {spec} holds no checkpoints/")

    found = check_policy_directory(path)
    config = config.copy_and_resolve_references()
    config.model.name, config.model.init_from = found.kind, str(path.resolve())
    hf = read_hf_config(path)
    positions = (hf.get("text_config") or hf).get("max_position_embeddings")
    if positions:  # no context past the policy's positions (at evaluation, YaRN's: eval.rope_scaling)
        scaled = int(int(positions) * config.eval.rope_scaling) if config.eval.rope_scaling else int(positions)
        config.eval.max_context_tokens = min(config.eval.max_context_tokens, scaled)
        config.rollout.max_context_tokens = min(config.rollout.max_context_tokens, int(positions))
    return EvalPolicy(path.name, config, build_policy(TrainSettings.from_config(config), config.seed))


def eval_settings(policy: EvalPolicy, suite: Any, agent: AgentConfig, num_workers: int, group_size: int = 1):
    """The run settings of `policy.config` with the suite's catalog, the evaluation agent
    `agent` and `num_workers` rollout workers. Each kind of the suite's tasks sets the config's
    fields its tasks need (`EnvironmentKind.suite_fields`: a suite of desktop tasks adds its
    folder to env.task_dirs, so the desktop pool is configured and checked as a run's would be,
    with room for a group of `group_size` episodes)."""
    settings = TrainSettings.from_config(suite_config(policy, suite, num_workers, group_size))
    return dataclasses.replace(settings, catalog=suite.catalog, eval_agent=agent)


def suite_config(policy: EvalPolicy, suite: Any, num_workers: int, group_size: int = 1) -> Any:
    """`policy.config` with `num_workers` rollout workers and the fields each kind of the
    suite's tasks sets (`EnvironmentKind.suite_fields`)."""
    config = policy.config.copy_and_resolve_references()
    config.rollout.num_workers = int(num_workers)
    kinds = [environment_kind(name) for name in sorted(suite.catalog.kinds)]
    kinds = [kind for kind in kinds if kind.suite_fields is not None]
    if kinds:
        own = TrainSettings.from_config(config).kind_configs  # the policy's, before the suite's fields
        for kind in kinds:
            fields = kind.suite_fields(own.get(kind.name), suite.folder, int(group_size))
            if suite.folder is not None and "env.task_dirs" in fields:
                fields = {**fields, "env.task_filter": suite.task_filter}  # its folder as the suite reads it
            apply_overrides(config, fields, f"suite {suite.name!r} ({kind.name} tasks)")
    return config


def build_eval_workers(
    policy: EvalPolicy,
    suite: Any,
    agent: AgentConfig,
    num_workers: int,
    env_wrapper: EnvWrapper | None = None,
    group_size: int = 1,
) -> list:
    """`num_workers` rollout workers running `policy` on the tasks of `suite` (a
    `suites.Suite`), with `agent` as their evaluation agent loop and groups of up to
    `group_size` episodes."""
    if num_workers < 1:
        raise ValueError(f"an evaluation needs at least one rollout worker, got {num_workers}")
    settings = eval_settings(policy, suite, agent, num_workers, group_size)
    if policy.scripted:
        # Scripted engines draw per request, so the engine needs no canonical order.
        return start_local_workers(
            [
                (
                    ScriptedEngineFactory(
                        policy.name,
                        settings.model.tokenizer_source,
                        seed=policy.config.seed + w,
                        action_space=policy.config.env.action_space,
                        replays=tuple(oracle_replays(list(suite.catalog)).items()) if policy.name == "oracle" else (),
                    ),
                    dataclasses.replace(rollout_worker_config(settings, w), canonical_order=False),
                )
                for w in range(num_workers)
            ],
            env_wrapper,
        )
    if policy.config.rollout.engine != "jax":
        raise ValueError(
            f"evaluation runs a policy on the JAX sampler; config.rollout.engine is {policy.config.rollout.engine!r}"
        )

    tokenizer, image_processor = load_run_processor(settings.model)
    banned = reserved_token_ids(ChatRenderer(tokenizer, image_processor))
    return build_rollout_workers(settings, policy.model, int(tokenizer.pad_token_id or 0), env_wrapper, banned)


def worker_factory(
    policy: EvalPolicy, suite: Any, num_workers: int, env_wrapper: EnvWrapper | None = None, group_size: int = 1
) -> Callable[[int, float], list]:
    """(turn budget, temperature) -> `build_eval_workers` with the policy config's evaluation
    agent (with the suite's fields: a desktop suite judges an episode at its turn limit) at that
    budget and temperature (what `harness.sweep` takes)."""
    base = TrainSettings.from_config(suite_config(policy, suite, num_workers, group_size)).eval_agent

    def make(turns: int, temperature: float) -> list:
        agent = dataclasses.replace(base, max_turns=int(turns), temperature=float(temperature))
        return build_eval_workers(policy, suite, agent, num_workers, env_wrapper, group_size)

    return make
