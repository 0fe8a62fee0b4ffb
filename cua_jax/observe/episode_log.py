"""The training run's episode log: one JSON line per collected episode, at <workdir>/episodes.jsonl.

    log = EpisodeLog(os.path.join(workdir, EPISODE_LOG))
    log.append(step, episodes, domains)          # after each learner step
    records = read_episode_log(log.path)
    rates = pass_rates(records)                  # {task_id: success fraction}

A line holds what synthesis needs of an episode, without its screenshots or tokens:

    {"step": 12, "episode_id": "...", "task_id": "...", "domain": "files", "group_id": 3,
     "status": "failure", "reward": 0.0, "policy_version": 11, "quarantine_reason": null,
     "instruction": "...", "replies": ["<the agent's reply of turn 0>", ...]}

A resumed run repeats the steps after its checkpoint: `EpisodeLog.drop_steps_from(step)`
removes what the interrupted run logged for them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cua_jax.observe.metrics import drop_records_from
from cua_jax.types import Episode, EpisodeStatus

EPISODE_LOG = "episodes.jsonl"


@dataclasses.dataclass(frozen=True)
class EpisodeRecord:
    """One logged episode: its provenance, outcome and the agent's reply per turn."""

    step: int
    episode_id: str
    task_id: str
    domain: str
    group_id: int
    status: EpisodeStatus
    reward: float
    policy_version: int
    quarantine_reason: str | None
    instruction: str
    replies: tuple[str, ...]

    @classmethod
    def from_episode(cls, step: int, episode: Episode, domain: str = "") -> EpisodeRecord:
        return cls(
            step=int(step),
            episode_id=str(episode.episode_id),
            task_id=str(episode.task_id),
            domain=str(domain),
            group_id=int(episode.group_id),
            status=EpisodeStatus(episode.status),
            reward=float(episode.reward),
            policy_version=int(episode.policy_version),
            quarantine_reason=episode.quarantine_reason,
            instruction=str(episode.instruction),
            replies=tuple(str(turn.response_text) for turn in episode.turns),
        )

    def to_json(self) -> dict[str, Any]:
        value = dataclasses.asdict(self)
        value["status"] = self.status.value
        value["replies"] = list(self.replies)
        return value

    @classmethod
    def from_json(cls, value: Any) -> EpisodeRecord:
        """A record from its decoded JSON line; raises ValueError naming the bad field."""
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object, got {type(value).__name__}")
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in value]
        if missing:
            raise ValueError(f"missing fields {missing}")

        def typed(name: str, kinds: tuple[type, ...], what: str) -> Any:
            field = value[name]
            if isinstance(field, bool) or not isinstance(field, kinds):
                raise ValueError(f"{name} must be {what}, got {field!r}")
            return field

        statuses = [s.value for s in EpisodeStatus]
        if value["status"] not in statuses:
            raise ValueError(f"status must be one of {statuses}, got {value['status']!r}")
        replies = typed("replies", (list,), "a list of strings")
        if not all(isinstance(r, str) for r in replies):
            raise ValueError("replies must be a list of strings")
        reason = value["quarantine_reason"]
        if reason is not None and not isinstance(reason, str):
            raise ValueError(f"quarantine_reason must be a string or null, got {reason!r}")
        return cls(
            step=typed("step", (int,), "an integer"),
            episode_id=typed("episode_id", (str,), "a string"),
            task_id=typed("task_id", (str,), "a string"),
            domain=typed("domain", (str,), "a string"),
            group_id=typed("group_id", (int,), "an integer"),
            status=EpisodeStatus(value["status"]),
            reward=float(typed("reward", (int, float), "a number")),
            policy_version=typed("policy_version", (int,), "an integer"),
            quarantine_reason=reason,
            instruction=typed("instruction", (str,), "a string"),
            replies=tuple(replies),
        )


class EpisodeLog:
    """Appends episodes to a JSON-lines file. Each call opens and closes the file, so a
    log made per step and a log kept for the whole run write the same lines."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)

    def append(self, step: int, episodes: Sequence[Episode], domains: Mapping[str, str]) -> None:
        """Log every episode of learner step `step`; `domains` maps task ids to their domain."""
        lines = [
            json.dumps(EpisodeRecord.from_episode(step, e, domains.get(e.task_id, "")).to_json(), ensure_ascii=False)
            + "\n"
            for e in episodes
        ]
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(lines))

    def drop_steps_from(self, step: int) -> None:
        """Remove the records of steps >= `step` (a resumed run logs them again)."""
        drop_records_from(self.path, step)


def read_episode_log(path: str | os.PathLike) -> list[EpisodeRecord]:
    """The records of an episode log, in file order; a malformed line raises ValueError
    naming the file and the line number."""
    path = os.fspath(path)
    records = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(EpisodeRecord.from_json(json.loads(line)))
            except ValueError as error:  # json.JSONDecodeError is a ValueError
                raise ValueError(f"{path}:{line_number}: malformed episode record: {error}") from None
    return records


def pass_rates(records: Iterable[EpisodeRecord]) -> dict[str, float]:
    """Per task, the fraction of its non-quarantined episodes that succeeded (an episode
    that ran out of budget counts as not solved); tasks with only quarantined episodes
    are absent."""
    counts: dict[str, list[int]] = {}
    for record in records:
        if record.status is not EpisodeStatus.QUARANTINED:
            tally = counts.setdefault(record.task_id, [0, 0])
            tally[0] += record.status is EpisodeStatus.SUCCESS
            tally[1] += 1
    return {task_id: solved / total for task_id, (solved, total) in counts.items()}
