"""Held-out evaluation: success on seeds neither training nor demonstrations use, with Wilson's
interval, per-task rates and per-episode outcomes; the gain between two evaluations with
Newcombe's interval, unpaired and paired by seed; episode traces people can look at."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cua_jax.checks import require_at_least
from cua_jax.envs import actions as A
from cua_jax.eval.harness import evaluate, summarize, write_tables
from cua_jax.eval.intervals import difference_interval, paired_difference_interval
from cua_jax.eval.suites import Suite
from cua_jax.tasks.sources import TaskCatalog
from cua_jax.types import Episode, EpisodeStatus, TrainingItem


class RunPolicy:
    """The policy a run's rollout workers already hold, as the harness takes policies: it runs
    every task and needs no binding."""

    name = "policy"
    per_task = False

    def unsupported(self, task: Any) -> str | None:
        return None

    def bind(self, worker: Any, task_id: str) -> None:
        pass


def summary_metrics(summary: Mapping[str, Any], tasks: Sequence[str]) -> dict[str, Any]:
    """A harness summary (`cua_jax.eval.harness.evaluate`) as a run's evaluation metrics: the
    success rate over scored episodes with its Wilson interval, counts (successes, episodes,
    quarantined records, given-up samples), pass@k, mean turns, the valid-action rate, per-task
    success ("success/<task>"), and "outcomes": each sample's outcome by "task/seed/sample",
    the same keys in every evaluation, for the paired gain."""
    overall = summary["overall"]
    scored: dict[str, Mapping[str, Any]] = {}
    for r in summary["records"]:
        if r["status"] != EpisodeStatus.QUARANTINED.value:
            scored.setdefault(f"{r['task']}/{r['seed']}/{r['sample']}", r)
    turns = sum(r["turns"] for r in scored.values())
    result: dict[str, Any] = {
        "success_rate": overall["success_rate"],
        "ci_low": overall["ci_low"],
        "ci_high": overall["ci_high"],
        "successes": float(overall["successes"]),
        "episodes": float(overall["episodes"]),
        "quarantined": float(overall["quarantined"]),
        "given_up": float(overall["given_up"]),
        "pass@k": overall["pass@k"],
        "turns": turns / len(scored) if scored else 0.0,
        "valid_action_rate": sum(r.get("valid_actions", r["turns"]) for r in scored.values()) / max(turns, 1),
    }
    for task in tasks:
        result[f"success/{task}"] = summary["tasks"][task]["success_rate"] if task in summary["tasks"] else 0.0
    result["outcomes"] = {key: int(r["success"]) for key, r in scored.items()}
    return result


def success_gain(
    first: Mapping[str, Any], second: Mapping[str, Any], confidence: float, paired: bool
) -> dict[str, float]:
    """second's success rate minus first's, with Newcombe's interval for independent samples
    (`difference_interval`) and, when `paired` (one episode per held-out seed in both), the
    interval paired by seed (`paired_difference_interval`, on the episodes scored in both;
    "gained" / "lost" count the seeds that changed outcome)."""
    difference, low, high = difference_interval(
        int(first["successes"]), int(first["episodes"]), int(second["successes"]), int(second["episodes"]), confidence
    )
    gain = {"difference": difference, "ci_low": low, "ci_high": high, "confidence": confidence}
    if paired and "outcomes" in first and "outcomes" in second:
        common = sorted(set(first["outcomes"]) & set(second["outcomes"]))
        table = collections.Counter((first["outcomes"][k], second["outcomes"][k]) for k in common)
        counts = (table[1, 1], table[1, 0], table[0, 1], table[0, 0])
        value, paired_low, paired_high = paired_difference_interval(*counts, confidence)
        gain.update(
            {
                "paired_episodes": float(len(common)),
                "paired_difference": value,
                "paired_ci_low": paired_low,
                "paired_ci_high": paired_high,
                "lost": float(counts[1]),
                "gained": float(counts[2]),
            }
        )
    return gain


def task_result(result: Mapping[str, Any], task: str) -> dict[str, Any]:
    """One task's part of an evaluation's metrics (`summary_metrics`): its successes, episodes
    and outcomes, read off the per-episode outcomes ("task/seed/sample" keys)."""
    outcomes = {key: value for key, value in result["outcomes"].items() if key.rsplit("/", 2)[0] == task}
    return {"successes": float(sum(outcomes.values())), "episodes": float(len(outcomes)), "outcomes": outcomes}


def per_task_gains(
    first: Mapping[str, Any], second: Mapping[str, Any], tasks: Sequence[str], confidence: float, paired: bool
) -> dict[str, dict[str, float]]:
    """`success_gain` of each task in `tasks` that both evaluations scored, with its successes
    and scored episodes in each ("successes_before", "episodes_before", ...)."""
    gains = {}
    for task in tasks:
        a, b = task_result(first, task), task_result(second, task)
        if a["episodes"] and b["episodes"]:
            gains[task] = {
                "successes_before": a["successes"],
                "episodes_before": a["episodes"],
                "successes_after": b["successes"],
                "episodes_after": b["episodes"],
                **success_gain(a, b, confidence, paired),
            }
    return gains


COMPUTER_ACTIONS = typing.get_args(A.Action)
TRACE_FORMAT = 2  # trace.json layout: per-turn tokens, logprobs, points; per-episode advantage, staleness

# A DOM text line with geometry (cua_jax.envs.miniwob.dom_to_text): "[ref] ... @left,top wxh".
_ELEMENT_BOX = re.compile(
    r"^\s*\[(?P<ref>-?\d+)\] .*? @(?P<left>-?[\d.]+),(?P<top>-?[\d.]+) "
    r"(?P<width>[\d.]+)x(?P<height>[\d.]+)(?: click=\[\d+, \d+\])?$",
    re.MULTILINE,
)


def action_points(action: Any, width: int, height: int) -> list[list[int]]:
    """The screenshot pixels an action points at, converted from the action grid: [] when it
    has none, one point for clicks, moves, scrolls and button presses, [start, end] for a drag
    that names its start (a drag from the pointer gives its end only)."""
    if isinstance(action, A.LeftClickDrag) and action.start_x is not None:
        grid_points = [(action.start_x, action.start_y), (action.x, action.y)]
    elif A.uses_coordinates(action):
        grid_points = [(action.x, action.y)]
    else:
        grid_points = []
    return [list(A.grid_to_pixels(x, y, width, height)) for x, y in grid_points]


def element_box(observation_text: str, element: int) -> list[float] | None:
    """[left, top, width, height] of element `element` as the observation's DOM text places it
    (page pixels, which are the screenshot's: the screenshot is the task region), or None when
    the text does not give its geometry."""
    for match in _ELEMENT_BOX.finditer(observation_text or ""):
        if int(match["ref"]) == element:
            return [float(match[k]) for k in ("left", "top", "width", "height")]
    return None


def decode_tokens(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token id decoded on its own (`tokenizer.decode([id])`), so the viewer can shade it."""
    return [tokenizer.decode([int(i)]) for i in ids]


def _floats(values: Any) -> list[float | None]:
    return [float(v) if np.isfinite(v) else None for v in np.asarray(values, np.float64).reshape(-1)]


def turn_logprobs_from_items(
    episode: Episode, items: Sequence[TrainingItem], item_logprobs: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """Per turn of `episode`, the learner's logprob of each response token, read off the
    items that train it: an item's loss-masked positions hold the responses of its
    step_indices, in order. Raises ValueError when the items do not cover the responses."""
    per_turn: dict[int, np.ndarray] = {}
    for item, logprobs in zip(items, item_logprobs):
        if item.episode_id != episode.episode_id:
            continue
        row = np.asarray(logprobs, np.float32).reshape(-1)
        if len(row) < len(item):
            raise ValueError(
                f"{episode.episode_id}: item of turns {item.step_indices} has {len(item)} tokens, "
                f"its logprobs {len(row)}"
            )
        masked = row[: len(item)][np.asarray(item.loss_mask) > 0]  # rows may be padded past the item
        lengths = [len(episode.turns[t].response_ids) for t in item.step_indices]
        if sum(lengths) != len(masked):
            raise ValueError(
                f"{episode.episode_id}: item of turns {item.step_indices} trains {len(masked)} tokens, "
                f"its turns' responses hold {sum(lengths)}"
            )
        for t, part in zip(item.step_indices, np.split(masked, np.cumsum(lengths)[:-1])):
            per_turn[t] = part
    return [
        per_turn.get(t, np.full(len(turn.response_ids), np.nan, np.float32)) for t, turn in enumerate(episode.turns)
    ]


def trace_record(
    episode: Episode,
    tokenizer: Any = None,
    learner_logprobs: Sequence[np.ndarray] | None = None,
    advantage: float | None = None,
    turn_advantages: Mapping[int, float] | None = None,
    version: int | None = None,
) -> dict[str, Any]:
    """The trace.json record of an episode (without its screenshot names): see `save_traces`."""
    if learner_logprobs is not None and len(learner_logprobs) != len(episode.turns):
        raise ValueError(
            f"{episode.episode_id}: learner logprobs for {len(learner_logprobs)} turns, "
            f"the episode has {len(episode.turns)}"
        )
    turns = []
    for t, turn in enumerate(episode.turns):
        ids = np.asarray(turn.response_ids).reshape(-1)
        height, width = np.asarray(turn.images[0]).shape[:2] if turn.images else (None, None)
        element = getattr(turn.action, "element", None)
        turn_version = None if turn.info.get("policy_version") is None else int(turn.info["policy_version"])
        learner = None if learner_logprobs is None else _floats(learner_logprobs[t])
        if learner is not None and len(learner) != len(ids):
            raise ValueError(
                f"{episode.episode_id}: turn {t} has {len(ids)} response tokens, its learner logprobs {len(learner)}"
            )
        turns.append(
            {
                "screenshots": [],
                "screen_size": None if width is None else [int(width), int(height)],
                "observation_text": turn.observation_text,
                "response": turn.response_text,
                "action": repr(turn.action),
                # Computer-use actions' tool-call arguments (a code tool call's repr says it all).
                "action_arguments": A.action_arguments(turn.action)
                if isinstance(turn.action, COMPUTER_ACTIONS)
                else None,
                "invalid_action": turn.info.get("invalid_action"),
                "reward": turn.reward,
                "points": [] if width is None or turn.action is None else action_points(turn.action, width, height),
                "element": element,
                "element_box": None if element is None else element_box(turn.observation_text, element),
                "policy_version": turn_version,
                "staleness": None if version is None or turn_version is None else int(version) - turn_version,
                "advantage": None if turn_advantages is None else turn_advantages.get(t),
                "token_ids": [int(i) for i in ids],
                "tokens": None if tokenizer is None else decode_tokens(tokenizer, ids),
                "rollout_logprobs": _floats(turn.response_logprobs),
                "learner_logprobs": learner,
            }
        )
    return {
        "format": TRACE_FORMAT,
        "episode_id": episode.episode_id,
        "task_id": episode.task_id,
        "group_id": episode.group_id,
        "seed": None if episode.info.get("seed") is None else int(episode.info["seed"]),
        "instruction": episode.instruction,
        "status": episode.status.value,
        "reward": episode.reward,
        "quarantine_reason": episode.quarantine_reason,
        # How a scored episode ended (e.g. a fault its agent owns), and (code) what it changed
        # outside the files the judge takes.
        "end_reason": episode.info.get("end_reason"),
        "changes_outside_sources": episode.info.get("changes_outside_sources_count"),
        # A DTAC replay: the episode whose cached success this is (its policy_version is the
        # version that sampled it, so its staleness is its true age).
        "replay_of": episode.info.get("replay_of"),
        "policy_version": episode.policy_version,
        "saved_at_version": version,
        "staleness": None if version is None else int(version) - int(episode.policy_version),
        "advantage": advantage,
        "turns": turns,
    }


def save_traces(
    directory: str,
    episodes: Sequence[Episode],
    tokenizer: Any = None,
    learner_logprobs: Mapping[str, Sequence[np.ndarray]] | None = None,
    advantages: Mapping[str, float] | None = None,
    version: int | None = None,
    turn_advantages: Mapping[str, Mapping[int, float]] | None = None,
) -> None:
    """Each episode as <directory>/<k>/turn_<t>_<i>.png screenshots plus trace.json, what the
    trajectory viewer (`cua_jax.observe.viewer`) shows.

    trace.json (format TRACE_FORMAT): the episode's ids, task, seed, instruction, status, reward,
    quarantine reason, policy version, `saved_at_version` (`version`, the policy's version when
    saved), staleness (saved_at_version minus the episode's version), advantage; per turn: the
    screenshots, screen size, observation text, reply, action (repr and tool-call arguments),
    invalid-action message, reward, `points` (the action's screenshot pixels: [start, end] for a
    drag), `element` and `element_box` (element actions), policy version and staleness, advantage,
    token ids, `tokens` (each id decoded alone; null without a tokenizer), `rollout_logprobs` (the
    engine's) and `learner_logprobs` (null unless given). Optional, by episode id:
    `learner_logprobs` (one array per turn), `advantages`, `turn_advantages` (turn -> advantage)."""
    from PIL import Image

    for k, episode in enumerate(episodes):
        folder = os.path.join(directory, f"{k:02d}")
        os.makedirs(folder, exist_ok=True)
        record = trace_record(
            episode,
            tokenizer,
            None if learner_logprobs is None else learner_logprobs.get(episode.episode_id),
            None if advantages is None else advantages.get(episode.episode_id),
            None if turn_advantages is None else turn_advantages.get(episode.episode_id),
            version,
        )
        for t, turn in enumerate(episode.turns):
            for i, image in enumerate(turn.images):
                name = f"turn_{t:02d}_{i}.png"
                Image.fromarray(np.asarray(image, np.uint8)).save(os.path.join(folder, name))
                record["turns"][t]["screenshots"].append(name)
        with open(os.path.join(folder, "trace.json"), "w") as f:
            json.dump(record, f, indent=2, ensure_ascii=False)


def _episode_advantages(batch: Any) -> tuple[dict[str, list[int]], dict[str, float]]:
    """(each episode's item indices, each episode's advantage: the mean of its items')."""
    by_episode: dict[str, list[int]] = collections.defaultdict(list)
    for i, item in enumerate(batch.items):
        by_episode[item.episode_id].append(i)
    advantages = {e: float(np.mean([batch.item_advantages[i] for i in rows])) for e, rows in by_episode.items()}
    return by_episode, advantages


def traced_episodes(batch: Any, num_episodes: int) -> list[str]:
    """The ids of the `num_episodes` episodes of a learner step's batch (a `PreparedBatch`, or
    its summary: only items' episode ids and advantages are read) that its training traces
    show: those with the largest advantages in magnitude, alternating sign (what the step
    pushed up and down hardest); an episode's advantage is the mean of its items'."""
    return _hardest_pushed(_episode_advantages(batch)[1], num_episodes)


def _hardest_pushed(advantages: Mapping[str, float], num_episodes: int) -> list[str]:
    ups = sorted((e for e in advantages if advantages[e] >= 0), key=lambda e: -advantages[e])
    downs = sorted((e for e in advantages if advantages[e] < 0), key=lambda e: advantages[e])
    return [e for pair in itertools.zip_longest(ups, downs) for e in pair if e is not None][:num_episodes]


def save_training_traces(
    directory: str,
    batch: Any,
    score_items: Callable[[Sequence[int]], Sequence[np.ndarray]],
    version: int,
    num_episodes: int = 3,
    tokenizer: Any = None,
    chosen: Sequence[str] | None = None,
) -> list[str]:
    """Saves `num_episodes` episodes of a learner step's batch (a `PreparedBatch`) as traces
    (`save_traces`) with the learner's logprobs and the advantages; returns their episode ids.

    The episodes are `traced_episodes(batch, num_episodes)` unless `chosen` names them (ids of
    the batch's episodes, in order). An episode's advantage is the mean of its items'; a
    turn's is the advantage of its item. `score_items(indices)`: the learner's per-token
    logprobs ([L] each, aligned with the item's ids) of the batch's items at `indices`; only
    the chosen episodes' items are scored."""
    by_episode, advantages = _episode_advantages(batch)
    if chosen is None:
        chosen = _hardest_pushed(advantages, num_episodes)
    indices = [i for e in chosen for i in by_episode[e]]
    rows = list(score_items(indices))
    if len(rows) != len(indices):
        raise ValueError(f"score_items returned {len(rows)} rows for {len(indices)} items")
    scored = dict(zip(indices, rows))
    episodes = [batch.episodes[e] for e in chosen]
    logprobs = {
        e: turn_logprobs_from_items(
            batch.episodes[e], [batch.items[i] for i in by_episode[e]], [scored[i] for i in by_episode[e]]
        )
        for e in chosen
    }
    turn_advantages = {
        e: {t: float(batch.item_advantages[i]) for i in by_episode[e] for t in batch.items[i].step_indices}
        for e in chosen
    }
    save_traces(directory, episodes, tokenizer, logprobs, advantages, version, turn_advantages)
    return list(chosen)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """A run's held-out evaluation (config.eval; experiments/configs/base.py says what each field
    does). The agent's budgets and sampling (max_turns .. seed_per_turn) are checked where the
    evaluation agent is built (cua_jax.rollout.agent_loop.AgentConfig)."""

    enabled: bool
    tasks: tuple[str, ...]
    num_seeds: int
    group_size: int
    concurrent_groups: int
    every_steps: int
    max_reruns: int
    max_turns: int
    max_context_tokens: int
    rope_scaling: float
    temperature: float
    low_temperature: float
    top_p: float
    top_k: int
    seed_per_turn: bool
    confidence: float
    num_traces: int
    judge_at_budget: bool = False

    def __post_init__(self):
        require_at_least(self, ("num_seeds", "group_size", "concurrent_groups"), 1)
        require_at_least(self, ("every_steps", "max_reruns", "num_traces"), 0)
        if not (self.low_temperature < 0 or self.low_temperature < self.temperature):
            raise ValueError(
                f"EvalConfig.low_temperature must be below temperature ({self.temperature}) to run, or < 0 "
                f"(off); got {self.low_temperature}"
            )
        if not (self.rope_scaling == 0 or self.rope_scaling > 1):
            raise ValueError(f"EvalConfig.rope_scaling must be 0 (off) or a YaRN factor > 1, got {self.rope_scaling}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"EvalConfig.confidence must lie in (0, 1), got {self.confidence}")


def evaluate_held_out(
    workers: Sequence[Any],
    tasks: Sequence[str],
    evaluation: EvalConfig,
    seed_start: int,
    catalog: Any,
    out: str,
    traces: str,
    tokenizer: Any = None,
    version: int | None = None,
    temperature: float | None = None,
    processes: Any = None,
) -> dict[str, Any]:
    """One held-out evaluation of a run through the evaluation harness: evaluation.num_seeds
    seeds from `seed_start` (config.env.eval_seed_start) of each task in `tasks` (SourceTasks of
    `catalog`), evaluation.group_size samples each, evaluation.concurrent_groups groups per worker
    call over `workers`, quarantined samples re-run up to evaluation.max_reruns times; the harness
    files and tables go to `out` (a killed evaluation resumes there). Returns `summary_metrics`;
    evaluation.num_traces traces spread over the tasks go to `traces` (`save_traces`: with
    `tokenizer`, the replies' tokens; with `version`, the policy's current version).
    `temperature` replaces evaluation.temperature (the same seeds and per-turn sampling seeds).

    processes: a coordinated run's place among its processes (index, count, exchange; a
    `cua_jax.train.coordinated.ProcessGroup`), every process calling this together. Each runs
    every task on its share of the seeds (seeds[index::count]) on its own workers, its harness
    files in <out>/process_<index>; the records are then exchanged, so every process returns the
    same metrics over all the seeds, and process 0 writes the whole tables to `out` and the
    traces. With per-turn sampling seeds (eval.seed_per_turn) a seed's episode is the same
    whichever process runs it, so the result is a one-process evaluation's."""
    e = evaluation
    suite = Suite("held_out", TaskCatalog([catalog[t] for t in tasks]), seed_start=seed_start)
    first_episode: dict[str, Episode] = {}  # per task: what the traces show, one episode kept each

    def keep(job, rollouts):
        for rollout in rollouts:
            first_episode.setdefault(job.task, rollout.episode)

    title = "held-out evaluation" + ("" if temperature is None else f" at temperature {temperature:g}")
    seeds = suite.seeds(e.num_seeds)
    index, count = (0, 1) if processes is None else (processes.index, processes.count)
    own_seeds = seeds[index::count]
    own: dict[str, Any] = {"records": [], "skipped": dict(suite.skipped)}
    if own_seeds:  # a process past the seed count has none to run
        own = evaluate(
            workers,
            RunPolicy(),
            suite,
            own_seeds,
            e.group_size,
            out if count == 1 else os.path.join(out, f"process_{index}"),
            max_reruns=e.max_reruns,
            confidence=e.confidence,
            progress=False,
            groups_per_call=e.concurrent_groups,
            on_group=keep,
            temperature=temperature,
            title=title,
        )
    summary = own
    if count > 1:
        shares = processes.exchange({"records": own["records"], "skipped": own["skipped"]})
        records = [record for share in shares for record in share["records"]]
        skipped = {task: why for share in shares for task, why in share["skipped"].items()}
        summary = summarize(records, e.group_size, e.confidence, title=title, suite=suite, seeds=seeds, skipped=skipped)
        if index == 0:
            write_tables(out, summary)
        summary["records"] = records
    if index == 0:
        episodes = [first_episode[t] for t in tasks if t in first_episode]
        stride = max(1, len(episodes) // max(e.num_traces, 1))
        save_traces(traces, episodes[::stride][: e.num_traces], tokenizer, version=version)
    return summary_metrics(summary, tasks)
