# Single job: the multi-turn agent loop (observation, engine, action, environment) over episodes and groups.
"""The multi-turn computer-use agent: observation -> engine -> action -> environment, per turn.

One episode:

    reset the environment            -> instruction + first observation (screenshots, text)
    repeat until the episode ends:
        observe(t, text, screenshots) on the segmenter's EpisodeContext (a token diff)
        prompt()                      -> the engine's token ids (token-in, token-out)
        engine samples reasoning + one tool call; respond(t, ids, logprobs)
        env.parse_action(response)    -> an action, or InvalidAction (fed back next turn)
        environment step              -> next observation, reward, the outcome once done

and it ends (`faults.episode_outcome`) as

    SUCCESS / FAILURE  the environment's verdict (MiniWoB's JS reward, a desktop judge), which
                       also covers a declared done / FAIL and the task's own time limit;
    NO_VERDICT         a budget ran out first (`Episode.info["budget"]` says which): the
                       turns ("turns", `max_turns`), the context ("tokens": prompt +
                       `max_new_tokens` over `max_context_tokens`) or the episode's
                       responses ("response_tokens", `max_response_tokens`, below);
    QUARANTINED        the environment reported an infrastructure fault (browser crashed,
                       container exited, setup failed); `Episode.fault` says which.

The engine is shared: `GenerationBatcher` gathers the prompts of every episode waiting on it
into one `RolloutEngine.generate` call (run in a worker thread), so a group of n episodes of
one task against n environments runs concurrently on one event loop. Invalid actions never
raise: they count as a turn and the environment's feedback reaches the agent next turn.
A reply holding a vision placeholder token (RESERVED_TOKENS) cannot re-enter a rendered
history; it ends the episode as the policy's FAILURE (the reply is kept in
`Episode.info["rejected_response"]`, outside the turns and items). The JAX sampler never
samples them when built with `reserved_token_ids(renderer)` as its banned ids (and the
learner scores with the same ids banned); engines that can still emit them (vLLM) end here.

Episode budgets (CANOPY, Table A1: 32,768 response tokens per episode, 4,096 per observation):

* `max_response_tokens` caps the sum of generated tokens over all turns. Each turn's
  generation is limited to min(max_new_tokens, what the episode has left); once nothing is
  left and the episode has not ended, it ends NO_VERDICT with `Episode.info["budget"] ==
  "response_tokens"` before the next observation enters the context (the last, possibly
  cut, reply is still performed; a budget running out on the last allowed turn reads
  "turns"). The prompt-length check keeps using `max_new_tokens`, so every prompt of a
  batch fits the engine whatever the other episodes' budgets. (CANOPY has no per-turn cap:
  a large max_new_tokens leaves the episode's budget as the only bound.)
* `max_observation_tokens` caps one observation's text, counted in tokens of the episode's
  tokenizer: a longer text keeps its first tokens (at most the cap, cut at a token
  boundary) followed by OBSERVATION_TRUNCATED_MARKER, so the policy knows. The text is cut
  before the context renders it, so observations still enter the token stream as diffs,
  and `Turn.observation_text` holds what the agent saw (a replay renders the same ids).
  Screenshots are untouched. `Episode.info["truncated_observations"]` counts the cut ones.
* None (the default) switches a cap off.

The returned `Episode` holds, per turn, the engine's exact ids and logprobs, the text and
screenshots the agent saw, and the policy version; the segmenter's training items come from
the same context that built the prompts (`Rollout.items`), and equal `segmenter.segment(episode)`.
`Episode.info` records wall-clock time in the environment and waiting for generation, and
token counts.

Environments implement the environment contract (`cua_jax.envs.contract.AgentEnvironment`);
the agent loop depends on nothing else of them. With `group_start = "shared"` a group's
episodes begin from one prepared state: the first environment resets, the others start
from its `shared_state()` (a capsule fork, a desktop's setup run again).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cua_jax.context.segment import EpisodeContext, Segmenter
from cua_jax.envs import actions as A
from cua_jax.envs.contract import AgentEnvironment, EnvironmentFault, EnvObservation
from cua_jax.envs.faults import FAULT_KINDS, Attribution, Outcome, episode_outcome
from cua_jax.envs.prompts import PROMPT_STYLES, system_prompt
from cua_jax.observe import timeline
from cua_jax.rollout.engine import (
    EngineFault,
    FinishReason,
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingConfig,
    check_rope_scaling,
)
from cua_jax.types import Episode, EpisodeStatus, TrainingItem, Turn

# ------------------------------------------------------------------------------------
# Configuration and results
# ------------------------------------------------------------------------------------


GROUP_STARTS = ("fresh", "shared")


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """The agent loop's knobs.

    max_turns: turn budget; running out ends the episode NO_VERDICT.
    max_new_tokens: the engine's per-turn response budget.
    max_context_tokens: token budget; a turn whose prompt + max_new_tokens would exceed it
        is not generated and the episode ends NO_VERDICT (keep it within the engine's
        context length).
    temperature / top_p / top_k / seed: sampling (`SamplingConfig`); seed None draws fresh
        randomness on every engine call (with seed_per_turn, seed is the per-turn seeds' base).
    seed_per_turn: give every request its own sampling stream (`GenerationRequest.seed`),
        `turn_sampling_seed(seed, episode id, environment seed, turn)`: two runs over the same
        episodes (same group ids and environment seeds) draw the same random numbers at the
        same turns whatever batches their requests share, so comparing two policies on them
        uses common random numbers (evaluation before / after training).
    no_verdict_reward: terminal reward of a NO_VERDICT episode (ScaleCUA: -0.2).
    agent_faults: the fault kinds (`faults.FaultKind` or their values) scored as the agent's
        failure instead of quarantined (see faults.Attribution); the loop applies it to the
        faults its environments report.
    no_patch_reward / crash_reward: CANOPY's terminal constants for a code episode that left
        nothing to test (faults.Attribution).
    max_batch: the most prompts sent to the engine in one generate call (None: all waiting).
    batch_wait_s: how long a batch may wait for the group's other episodes to reach the
        engine (None: until all do); see GenerationBatcher.
    max_response_tokens: whole-episode cap on generated tokens (None: none); see the module doc.
    max_observation_tokens: cap on one observation's text in tokens (None: none); module doc.
    prompt_style: how the system prompt lists the action space (`prompts.PROMPT_STYLES`).
    action_space: which pointer actions the prompt lists and the parser accepts
        (`actions.ACTION_SPACES`: grid points, element ids, or both); a reply outside it is
        an invalid action. The environment must show element ids for "elements" / "both".
    group_start: "fresh" (every episode of a group resets on its own) or "shared" (one
        resets, the others start from its state: `AgentEnvironment.shared_state`).
    rope_scaling: the engine runs the policy's rope extended by YaRN at this factor (> 1;
        0: the model's own rope), `SamplingConfig.rope_scaling`: the evaluation agent's
        config.eval.rope_scaling.
    judge_at_budget: an episode that runs out of turns is judged on the state it reached
        (`AgentEnvironment.judge_current`; OSWorld scores its step limit so) instead of ending
        NO_VERDICT, where the environment can judge an unfinished episode; the evaluation
        agent's config.eval.judge_at_budget.
    """

    max_turns: int = 15
    max_new_tokens: int = 256
    max_context_tokens: int = 8192
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    seed_per_turn: bool = False
    no_verdict_reward: float = 0.0
    agent_faults: tuple[str, ...] = ()
    no_patch_reward: float = 0.0
    crash_reward: float = 0.0
    max_batch: int | None = None
    batch_wait_s: float | None = 0.5
    max_response_tokens: int | None = None
    max_observation_tokens: int | None = None
    prompt_style: str = "tool_schema"
    action_space: str = "coordinates"
    group_start: str = "fresh"
    rope_scaling: float = 0.0
    judge_at_budget: bool = False

    def __post_init__(self):
        unknown = [kind for kind in self.agent_faults if kind not in FAULT_KINDS]
        if unknown:
            raise ValueError(f"agent_faults {unknown} are no fault kinds; choose from {sorted(FAULT_KINDS)}")
        if self.group_start not in GROUP_STARTS:
            raise ValueError(f"group_start {self.group_start!r} is unknown; choose one of {GROUP_STARTS}")
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style {self.prompt_style!r} is unknown; choose one of {PROMPT_STYLES}")
        if self.action_space not in A.ACTION_SPACES:
            raise ValueError(f"action_space {self.action_space!r} is unknown; choose one of {A.ACTION_SPACES}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        check_rope_scaling(self.rope_scaling)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_context_tokens <= self.max_new_tokens:
            raise ValueError(
                f"max_context_tokens ({self.max_context_tokens}) must exceed max_new_tokens ({self.max_new_tokens})"
            )
        if self.max_batch is not None and self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 or None, got {self.max_batch}")
        if self.batch_wait_s is not None and self.batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0 or None, got {self.batch_wait_s}")
        if self.max_response_tokens is not None and self.max_response_tokens < 1:
            raise ValueError(
                "max_response_tokens (the episode's response budget) must be >= 1 or None, "
                f"got {self.max_response_tokens}"
            )
        if self.max_observation_tokens is not None and self.max_observation_tokens < 1:
            raise ValueError(
                f"max_observation_tokens (one observation's text budget) must be >= 1 or None, "
                f"got {self.max_observation_tokens}"
            )

    @property
    def attribution(self) -> Attribution:
        return Attribution(
            no_verdict_reward=self.no_verdict_reward,
            agent_faults=frozenset(self.agent_faults),
            no_patch_reward=self.no_patch_reward,
            crash_reward=self.crash_reward,
        )

    def sampling(self, stop_token_ids: Sequence[int]) -> SamplingConfig:
        return SamplingConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop_token_ids=tuple(int(t) for t in stop_token_ids),
            seed=self.seed,
            rope_scaling=self.rope_scaling,
        )


def turn_sampling_seed(base: int | None, episode_id: str, env_seed: int | None, turn: int) -> int:
    """The sampling seed of one turn of one episode, in [0, 2**31): a stable hash (unlike
    Python's salted `hash`) of the base seed, the episode id, its environment seed and the turn."""
    text = f"{0 if base is None else base}/{episode_id}/{env_seed}/{turn}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF


@dataclasses.dataclass
class Rollout:
    """A finished episode and the training items its context produced (segmenter.finish())."""

    episode: Episode
    items: list[TrainingItem]


# ------------------------------------------------------------------------------------
# Batched generation
# ------------------------------------------------------------------------------------


class GenerationBatcher:
    """Shares one RolloutEngine among the concurrent episodes of an event loop.

    Episodes register while they run (`episode()`); each `await generate(request)` joins the
    prompts waiting for the engine. A batch goes out when every running episode is waiting
    (or `max_batch` are), or `max_wait_s` after its first prompt arrived, whichever comes
    first: waiting for the group's slower environments buys one batched engine call per turn
    instead of one call per episode; the bound keeps a long-tailed environment from stalling
    the others (None: always wait for every running episode). The engine runs in a worker
    thread, so environments keep stepping meanwhile. One sampling config for every request,
    except that a request may ask for fewer new tokens (an episode's remaining response
    budget): the batch is sampled with the largest budget among its requests and each
    generation is cut to its own (finish reason LENGTH when the cut drops its end). Tokens
    are drawn one after another, so the cut reply is distributed as one sampled with the
    smaller budget.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        sampling: SamplingConfig,
        max_batch: int | None = None,
        max_wait_s: float | None = 0.5,
    ):
        self.engine = engine
        self.sampling = sampling
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.running_episodes = 0
        self._waiting: list[tuple[GenerationRequest, int, asyncio.Future]] = []
        self._changed: asyncio.Event | None = None
        self._runner: asyncio.Task | None = None
        self.batch_sizes: list[int] = []
        self.engine_seconds = 0.0

    @contextlib.contextmanager
    def episode(self):
        """Counts an episode as running (a batch may wait for it) while the block runs."""
        self.running_episodes += 1
        try:
            yield
        finally:
            self.running_episodes -= 1
            self._poke()

    def _poke(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _target(self) -> int:
        target = max(1, self.running_episodes)
        return target if self.max_batch is None else min(target, self.max_batch)

    async def generate(self, request: GenerationRequest, max_new_tokens: int | None = None) -> Generation:
        """The engine's generation for `request`, at most `max_new_tokens` long (None: the
        sampling config's max_new_tokens, which also bounds it)."""
        budget = self.sampling.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if not 1 <= budget <= self.sampling.max_new_tokens:
            raise ValueError(
                f"max_new_tokens must lie in [1, {self.sampling.max_new_tokens}] (the sampling config's), got {budget}"
            )
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((request, budget, future))
        if self._changed is None:
            self._changed = asyncio.Event()
        self._poke()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        return await future

    async def _gather(self) -> None:
        """Wait until the batch is complete (see the class doc) or its waiting time is up."""
        assert self._changed is not None
        loop = asyncio.get_running_loop()
        deadline = None if self.max_wait_s is None else loop.time() + self.max_wait_s
        while len(self._waiting) < self._target():
            self._changed.clear()
            timeout = None if deadline is None else deadline - loop.time()
            if timeout is not None and timeout <= 0:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                return

    async def _run(self) -> None:
        while self._waiting:
            await self._gather()
            size = len(self._waiting) if self.max_batch is None else min(self.max_batch, len(self._waiting))
            batch, self._waiting = self._waiting[:size], self._waiting[size:]
            batch = [entry for entry in batch if not entry[2].cancelled()]
            if not batch:
                continue
            largest = max(budget for _, budget, _ in batch)
            sampling = self.sampling
            if largest != sampling.max_new_tokens:
                sampling = dataclasses.replace(sampling, max_new_tokens=largest)
            start = time.perf_counter()
            try:
                generations = await asyncio.to_thread(self.engine.generate, [r for r, _, _ in batch], sampling)
                if len(generations) != len(batch):
                    raise RuntimeError(f"the engine returned {len(generations)} generations for {len(batch)} requests")
            except BaseException as error:  # every waiting episode learns of the engine's failure
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                if not isinstance(error, Exception):
                    raise
                continue
            finally:
                self.engine_seconds += time.perf_counter() - start
            self.batch_sizes.append(len(batch))
            for (_, budget, future), generation in zip(batch, generations):
                if not future.done():
                    future.set_result(_cut(generation, budget))


def _cut(generation: Generation, max_new_tokens: int) -> Generation:
    """`generation` with at most its first max_new_tokens tokens (LENGTH when some are dropped)."""
    if len(generation.token_ids) <= max_new_tokens:
        return generation
    return dataclasses.replace(
        generation,
        token_ids=generation.token_ids[:max_new_tokens],
        logprobs=generation.logprobs[:max_new_tokens],
        finish_reason=FinishReason.LENGTH,
    )


# ------------------------------------------------------------------------------------
# The agent loop
# ------------------------------------------------------------------------------------

# Vision placeholders: a reply holding one cannot be put back into a rendered history.
RESERVED_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")

# Appended to an observation text cut to `max_observation_tokens`, so the policy knows.
OBSERVATION_TRUNCATED_MARKER = "\n[observation truncated]"


def reserved_token_ids(renderer) -> tuple[int, ...]:
    """The ids of RESERVED_TOKENS in `renderer`'s tokenizer and its image placeholder, sorted:
    what a reply must never hold (the sampler's and the learner's banned_token_ids)."""
    vocab = renderer.tokenizer.get_vocab()
    return tuple(sorted({vocab[t] for t in RESERVED_TOKENS if t in vocab} | {int(renderer.image_pad_id)}))


def truncate_observation(text: str, tokenizer, max_tokens: int) -> tuple[str, bool]:
    """(text, False) when `text` holds at most max_tokens tokens of `tokenizer`; otherwise
    (its longest prefix ending at a token boundary that holds at most max_tokens tokens,
    followed by OBSERVATION_TRUNCATED_MARKER; True). Needs a tokenizer with offset mappings
    (a fast tokenizer)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = encoded["offset_mapping"]
    if len(offsets) <= max_tokens:
        return text, False
    # Cut where the first dropped token starts; a character split over several byte-level
    # tokens goes whole. Re-encoding a prefix may merge differently, so check and back off.
    keep = max_tokens
    while True:
        kept = text[: offsets[keep][0]]
        if keep == 0 or len(tokenizer.encode(kept, add_special_tokens=False)) <= max_tokens:
            return kept + OBSERVATION_TRUNCATED_MARKER, True
        keep -= 1


class AgentLoop:
    """Runs episodes of a policy (a RolloutEngine) against AgentEnvironments.

    segmenter: the context strategy; its EpisodeContext builds every engine prompt.
    system_prompt_for: (width, height) of the first screenshot -> system prompt; default
        `prompts.system_prompt` in `config.prompt_style` (the action space rendered from
        cua_jax.envs.actions). An environment whose `system_prompt` is set (tools of its own)
        gives the prompt of its episodes instead, and parses their replies (`parse_action`).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        segmenter: Segmenter,
        config: AgentConfig = AgentConfig(),
        system_prompt_for=None,
    ):
        self.engine = engine
        self.segmenter = segmenter
        self.config = config
        self.system_prompt_for = system_prompt_for or functools.partial(
            system_prompt, style=config.prompt_style, action_space=config.action_space
        )
        self.end_of_turn_id = int(segmenter.renderer.end_of_turn_id)
        # Tokens a reply must not hold: rendered again, they would stand for images.
        self.reserved_ids = np.asarray(reserved_token_ids(segmenter.renderer), np.int32)
        self.sampling = config.sampling((self.end_of_turn_id,))
        self._batchers: dict[asyncio.AbstractEventLoop, GenerationBatcher] = {}
        self._rng = random.Random(config.seed)  # draws group seeds when none is given

    def batcher(self) -> GenerationBatcher:
        """The GenerationBatcher of the running event loop (one per loop)."""
        loop = asyncio.get_running_loop()
        batcher = self._batchers.get(loop)
        if batcher is None:
            for closed in [other for other in self._batchers if other.is_closed()]:
                del self._batchers[closed]
            batcher = self._batchers[loop] = GenerationBatcher(
                self.engine, self.sampling, self.config.max_batch, self.config.batch_wait_s
            )
        return batcher

    async def run_group(
        self,
        envs: Sequence[AgentEnvironment],
        task: Any,
        *,
        task_id: str | None = None,
        seed: int | None = None,
        group_id: int = 0,
    ) -> list[Rollout]:
        """n episodes of one task instance, one per environment, concurrently.

        Every episode gets the same seed (one drawn from the loop's RNG when None), so the
        group shares its task instance, as group-relative advantages need. Episode ids are
        f"{task_id}/g{group_id}/e{i}". Returns the rollouts in environment order.
        """
        if not envs:
            raise ValueError("run_group needs at least one environment")
        task_id = str(task) if task_id is None else task_id
        seed = self._rng.randrange(2**31) if seed is None else seed
        ids = [f"{task_id}/g{group_id}/e{i}" for i in range(len(envs))]
        batcher = self.batcher()
        # Every episode counts as running from the start (a batch waits for the whole group),
        # and stops counting when it ends.
        running = [batcher.episode() for _ in envs]
        for count in running:
            count.__enter__()
        started = False

        async def run(env, start, episode_id, count):
            try:
                return await self._run_episode(env, start, task_id, seed, group_id, episode_id, batcher)
            finally:
                count.__exit__(None, None, None)

        try:
            starts = [functools.partial(env.reset, task, seed) for env in envs]
            if self.config.group_start == "shared" and len(envs) > 1:
                starts = await self._shared_starts(envs, task, seed)
            started = True
            return list(await asyncio.gather(*(run(*args) for args in zip(envs, starts, ids, running))))
        finally:
            if not started:
                for count in running:
                    count.__exit__(None, None, None)

    async def _shared_starts(self, envs: Sequence[AgentEnvironment], task: Any, seed: int) -> list:
        """Each episode's start when the group begins from one state: the first environment
        resets and shares its state; the others reset to it, concurrently. A fault of the
        first reset or of the capture is that episode's; the others then reset on their own."""
        leader = envs[0]
        try:
            with timeline.span("env"):
                first = await leader.reset(task, seed)
                state = await leader.shared_state()
        except EnvironmentFault as error:
            fault = error.fault

            async def failed():
                raise EnvironmentFault(fault)

            return [failed] + [functools.partial(env.reset, task, seed) for env in envs[1:]]

        async def leader_start():
            return first

        followers = [asyncio.ensure_future(env.reset_to(task, seed, state)) for env in envs[1:]]
        return [leader_start] + [functools.partial(_awaited, future) for future in followers]

    async def run_episode(
        self,
        env: AgentEnvironment,
        task: Any,
        *,
        task_id: str | None = None,
        seed: int | None = None,
        group_id: int = 0,
        episode_id: str | None = None,
    ) -> Rollout:
        """One episode of `task` on `env` (see the module docstring for how it ends)."""
        task_id = str(task) if task_id is None else task_id
        episode_id = episode_id or f"{task_id}/g{group_id}/e0"
        batcher = self.batcher()
        with batcher.episode():
            return await self._run_episode(
                env, functools.partial(env.reset, task, seed), task_id, seed, group_id, episode_id, batcher
            )

    async def _run_episode(
        self, env, start_episode, task_id, seed, group_id, episode_id, batcher: GenerationBatcher
    ) -> Rollout:
        """One episode on `env`, begun by `start_episode()` (an EnvReset, or EnvironmentFault);
        the environment hears that it ended (`end_episode`), however it ended."""
        try:
            return await self._play(env, start_episode, task_id, seed, group_id, episode_id, batcher)
        finally:
            await env.end_episode()

    async def _play(
        self, env, start_episode, task_id, seed, group_id, episode_id, batcher: GenerationBatcher
    ) -> Rollout:
        clock = _Clock()
        episode = Episode(episode_id=episode_id, task_id=task_id, group_id=group_id, instruction="", turns=[])
        try:
            with clock("env"):
                start = await start_episode()
        except EnvironmentFault as error:
            outcome = episode_outcome(fault=error.fault, rule=self.config.attribution)
            return self._finish(episode, None, outcome, clock, generations=[])
        first = start.observation
        if start.screen_size is not None:
            width, height = start.screen_size
        elif first.images:
            height, width = first.images[0].shape[:2]
        else:
            raise ValueError(f"{episode_id}: the first observation has no screenshot and the reset no screen_size")
        episode.instruction = start.instruction
        # An environment with tools of its own (a code container) describes them itself.
        tools = env.system_prompt
        episode.system_prompt = self.system_prompt_for(width, height) if tools is None else tools
        context = self.segmenter.start(episode_id, group_id, episode.system_prompt, episode.instruction)
        observation: EnvObservation = first
        generations: list[Generation] = []
        outcome: Outcome | None = None
        unanswered = False  # the context holds an observation without its response
        response_budget = self.config.max_response_tokens  # what the episode may still generate
        truncated_observations = 0
        for t in range(self.config.max_turns):
            turn_budget = self.config.max_new_tokens
            if response_budget is not None:
                if response_budget <= 0:
                    episode.info["budget"] = "response_tokens"
                    break
                turn_budget = min(turn_budget, response_budget)
            with timeline.span("agent_host"):  # the agent loop's own Python: render, tokenize, parse
                images = [np.asarray(image) for image in observation.images]
                text = observation.text
                if self.config.max_observation_tokens is not None:
                    text, truncated = truncate_observation(
                        text, self.segmenter.renderer.tokenizer, self.config.max_observation_tokens
                    )
                    truncated_observations += truncated
                context.observe(t, text, images)
                prompt = context.prompt()
            prompt_tokens = int(len(prompt.ids))
            if prompt_tokens + self.config.max_new_tokens > self.config.max_context_tokens:
                # This observation gets no response; the episode's turns end at the last
                # answered one, and its items are replayed from them (below) so that they
                # equal segmenter.segment(episode).
                episode.info["budget"] = "tokens"
                unanswered = True
                break
            seen = {s: turn.images for s, turn in enumerate(episode.turns)} | {t: images}
            request = GenerationRequest(
                prompt.ids,
                [seen[span.turn][span.index] for span in prompt.images],
                seed=turn_sampling_seed(self.config.seed, episode_id, seed, t) if self.config.seed_per_turn else None,
            )
            with clock("generation"):
                try:
                    generation = await batcher.generate(request, turn_budget)
                except EngineFault as error:
                    # The engine serving this turn died (the router restarts it): no verdict
                    # about the policy, so the episode is quarantined, not failed.
                    outcome = episode_outcome(fault=error.fault, rule=self.config.attribution)
                    unanswered = True
                    break
            reserved = generation.token_ids[np.isin(generation.token_ids, self.reserved_ids)]
            if len(reserved):
                # A placeholder token in the reply would be read as an image when the history
                # is rendered again: the reply cannot enter the context. The policy caused it.
                name = self.segmenter.renderer.tokenizer.convert_ids_to_tokens(int(reserved[0]))
                episode.info["rejected_response"] = {
                    "turn": t,
                    "ids": np.asarray(generation.token_ids, np.int32),
                    "logprobs": np.asarray(generation.logprobs, np.float32),
                }
                outcome = episode_outcome(
                    agent_failure=f"turn {t}: the response holds the reserved token {name!r}",
                    rule=self.config.attribution,
                )
                unanswered = True
                break
            generations.append(generation)
            if response_budget is not None:
                response_budget -= len(generation.token_ids)
            with timeline.span("agent_host"):
                context.respond(t, generation.token_ids, generation.logprobs)
                response_text = context.response_text(generation.token_ids)
                action = env.parse_action(response_text, self.config.action_space)
            turn = Turn(
                observation_text=text,
                images=images,
                response_ids=np.asarray(generation.token_ids, np.int32),
                response_logprobs=np.asarray(generation.logprobs, np.float32),
                response_text=response_text,
                action=None if isinstance(action, A.InvalidAction) else action,
                info={
                    "policy_version": int(generation.policy_version),
                    # A partial rollout's reply: (first token, version) of each segment.
                    "version_segments": generation.version_segments(),
                    "finish_reason": generation.finish_reason.value,
                    "prompt_tokens": prompt_tokens,
                },
            )
            if isinstance(action, A.InvalidAction):
                turn.info["invalid_action"] = action.message
            episode.turns.append(turn)
            with clock("env"):
                transition = await env.step(action)
            turn.reward = float(transition.reward)
            turn.info.update(transition.info)
            if transition.done:
                # A fault the environment reports is judged by this loop's rule (who owns it).
                outcome = (
                    transition.outcome
                    if transition.fault is None
                    else episode_outcome(fault=transition.fault, rule=self.config.attribution)
                )
                break
            if transition.observation is None:
                raise RuntimeError(f"{episode_id}: turn {t}: the environment returned no observation and no outcome")
            observation = transition.observation
        else:
            episode.info["budget"] = "turns"
            if self.config.judge_at_budget:
                with clock("env"):
                    judged = await env.judge_current()
                if judged is not None:  # the environment judged the state the episode reached
                    outcome = (
                        judged
                        if judged.fault is None
                        else episode_outcome(fault=judged.fault, rule=self.config.attribution)
                    )
                    episode.info["judged_at_budget"] = True
        if outcome is None:
            outcome = episode_outcome(budget_exhausted=True, rule=self.config.attribution)
        return self._finish(episode, context, outcome, clock, generations, unanswered, truncated_observations)

    def _finish(
        self,
        episode: Episode,
        context: EpisodeContext | None,
        outcome: Outcome,
        clock: _Clock,
        generations: list[Generation],
        unanswered: bool = False,
        truncated_observations: int = 0,
    ) -> Rollout:
        episode.status = outcome.status
        episode.reward = float(outcome.reward)
        episode.fault = outcome.fault
        if outcome.status is not EpisodeStatus.QUARANTINED and outcome.reason is not None:
            episode.info["end_reason"] = outcome.reason
        versions = [v for g in generations for _, v in g.version_segments()]
        # The oldest weights that produced any token: what a staleness window must compare.
        episode.policy_version = int(min(versions)) if versions else 0
        response_tokens = sum(len(g.token_ids) for g in generations)
        episode.info.update(
            env_seconds=clock.seconds["env"],
            generation_seconds=clock.seconds["generation"],
            response_tokens=int(response_tokens),
            prompt_tokens=[turn.info["prompt_tokens"] for turn in episode.turns],
            invalid_actions=sum("invalid_action" in turn.info for turn in episode.turns),
            truncated_observations=int(truncated_observations),
            policy_versions=sorted(set(int(v) for v in versions)),
        )
        with timeline.span("agent_host"):
            if context is None or not episode.turns:
                items = []
            elif unanswered:
                items = self.segmenter.segment(episode)
            else:
                items = context.finish()
        episode.info["items"] = len(items)
        return Rollout(episode, items)


class _Clock:
    """Accumulates wall-clock seconds per phase ("env", "generation")."""

    def __init__(self) -> None:
        self.seconds = {"env": 0.0, "generation": 0.0}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.seconds[phase] += end - start
            profile = timeline.active()
            if profile is not None and phase == "env":
                profile.add("env", start, end)


async def _awaited(future: asyncio.Future) -> Any:
    return await future


async def run_bounded(jobs, concurrency: int, make_env: Callable[[], Any]) -> list[Rollout]:
    """Runs (loop, task, task_id, seed, group_id) jobs, at most `concurrency` at once, each
    on an environment of `make_env()` that is reused for the next job."""
    queue: asyncio.Queue = asyncio.Queue()
    for index, job in enumerate(jobs):
        queue.put_nowait((index, job))
    results: list[Rollout | None] = [None] * len(jobs)

    async def worker():
        env = make_env()
        try:
            while not queue.empty():
                index, (loop, task, task_id, seed, group_id) = queue.get_nowait()
                results[index] = await loop.run_episode(
                    env, task, task_id=task_id, seed=seed, group_id=group_id, episode_id=f"{task_id}/s{seed}"
                )
        finally:
            await env.close()

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(jobs))))))
    return [r for r in results if r is not None]
