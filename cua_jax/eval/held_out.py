"""Held-out evaluation: success on seeds neither training nor demonstrations use, with Wilson's
interval, per-task rates and per-episode outcomes; the gain between two evaluations with
Newcombe's interval, unpaired and paired by seed; episode traces people can look at."""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cua_jax.eval.intervals import difference_interval, paired_difference_interval, wilson_interval
from cua_jax.types import Episode, EpisodeStatus


def held_out_requests(tasks: Sequence[str], seed_start: int, num_seeds: int) -> list[tuple[str, int, int]]:
    """(task, seed, group id) of every held-out group: seeds [seed_start, + num_seeds) of each
    task, with negative group ids (apart from training's), the same in every evaluation."""
    return [(task, seed_start + s, -(1 + t * num_seeds + s)) for t, task in enumerate(tasks) for s in range(num_seeds)]


def run_held_out(worker: Any, tasks: Sequence[str], eval_config: Any, seed_start: int) -> list[Episode]:
    """The held-out episodes of `tasks` on a rollout worker's evaluation agent loop, at most
    eval_config.concurrent_groups groups at a time, in request order."""
    requests = held_out_requests(tasks, seed_start, eval_config.num_seeds)
    episodes: list[Episode] = []
    for start in range(0, len(requests), eval_config.concurrent_groups):
        results = worker.run_groups(requests[start:start + eval_config.concurrent_groups], eval_config.group_size,
                                    evaluation=True)
        episodes.extend(r.episode for rollouts in results for r in rollouts)
    return episodes


def success_summary(episodes: Sequence[Episode], tasks: Sequence[str], confidence: float) -> dict[str, Any]:
    """Success rate of the episodes not quarantined, its Wilson interval, counts, mean turns,
    the valid-action rate, per-task success ("success/<task>") and each episode's outcome by id
    ("outcomes": the same ids on the same seeds in every evaluation, for the paired gain)."""
    scored = [e for e in episodes if e.status is not EpisodeStatus.QUARANTINED]
    successes = sum(e.status is EpisodeStatus.SUCCESS for e in scored)
    low, high = wilson_interval(successes, len(scored), confidence)
    turns = [t for e in scored for t in e.turns]
    result: dict[str, Any] = {
        "success_rate": successes / max(len(scored), 1), "ci_low": low, "ci_high": high,
        "successes": float(successes),
        "episodes": float(len(scored)), "quarantined": float(len(episodes) - len(scored)),
        "turns": float(np.mean([e.num_turns for e in scored])) if scored else 0.0,
        "valid_action_rate": sum(t.action is not None for t in turns) / max(len(turns), 1),
    }
    for task in tasks:
        of_task = [e for e in scored if e.task_id == task]
        result[f"success/{task}"] = sum(e.status is EpisodeStatus.SUCCESS for e in of_task) / max(len(of_task), 1)
    result["outcomes"] = {e.episode_id: int(e.status is EpisodeStatus.SUCCESS) for e in scored}
    return result


def success_gain(first: Mapping[str, Any], second: Mapping[str, Any], confidence: float,
                 paired: bool) -> dict[str, float]:
    """second's success rate minus first's, with Newcombe's interval for independent samples
    (`difference_interval`) and, when `paired` (one episode per held-out seed in both), the
    interval paired by seed (`paired_difference_interval`, on the episodes scored in both;
    "gained" / "lost" count the seeds that changed outcome)."""
    difference, low, high = difference_interval(int(first["successes"]), int(first["episodes"]),
                                                int(second["successes"]), int(second["episodes"]), confidence)
    gain = {"difference": difference, "ci_low": low, "ci_high": high, "confidence": confidence}
    if paired and "outcomes" in first and "outcomes" in second:
        common = sorted(set(first["outcomes"]) & set(second["outcomes"]))
        table = collections.Counter((first["outcomes"][k], second["outcomes"][k]) for k in common)
        counts = (table[1, 1], table[1, 0], table[0, 1], table[0, 0])
        value, paired_low, paired_high = paired_difference_interval(*counts, confidence)
        gain.update({"paired_episodes": float(len(common)), "paired_difference": value,
                     "paired_ci_low": paired_low, "paired_ci_high": paired_high,
                     "lost": float(counts[1]), "gained": float(counts[2])})
    return gain


def save_traces(directory: str, episodes: Sequence[Episode]) -> None:
    """Each episode as <directory>/<k>/turn_<t>.png screenshots plus trace.json (actions, rewards)."""
    from PIL import Image

    for k, episode in enumerate(episodes):
        folder = os.path.join(directory, f"{k:02d}")
        os.makedirs(folder, exist_ok=True)
        turns = []
        for t, turn in enumerate(episode.turns):
            shots = []
            for i, image in enumerate(turn.images):
                name = f"turn_{t:02d}_{i}.png"
                Image.fromarray(np.asarray(image, np.uint8)).save(os.path.join(folder, name))
                shots.append(name)
            turns.append({"screenshots": shots, "observation_text": turn.observation_text,
                          "response": turn.response_text, "action": repr(turn.action),
                          "invalid_action": turn.info.get("invalid_action"), "reward": turn.reward})
        record = {"episode_id": episode.episode_id, "task_id": episode.task_id, "instruction": episode.instruction,
                  "status": episode.status.value, "reward": episode.reward,
                  "quarantine_reason": episode.quarantine_reason, "turns": turns}
        with open(os.path.join(folder, "trace.json"), "w") as f:
            json.dump(record, f, indent=2)


def evaluate_held_out(worker: Any, tasks: Sequence[str], config: Any, directory: str) -> dict[str, Any]:
    """One held-out evaluation of a run (`config`: its eval and env sections): `run_held_out`,
    `success_summary`, and config.eval.num_traces traces spread over the tasks, saved under
    `directory`."""
    episodes = run_held_out(worker, tasks, config.eval, config.env.eval_seed_start)
    result = success_summary(episodes, tasks, config.eval.confidence)
    stride = max(1, len(episodes) // max(config.eval.num_traces, 1))
    save_traces(directory, episodes[::stride][: config.eval.num_traces])
    return result

