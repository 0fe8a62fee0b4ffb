"""The nouns shared by every layer: episode status, faults, turns, episodes, training items.

Arrays held here are numpy (host) arrays: these records cross process boundaries
(Ray actors, checkpoints) and are batched into device arrays only by the batcher.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np


class EpisodeStatus(str, enum.Enum):
    """How an episode ended (CANOPY App. G attribution).

    SUCCESS / FAILURE: the verifier gave a verdict, or the policy caused the end
    (bad action text, declared FAIL, its own timeout) and it is scored as a failure.
    NO_VERDICT: the turn or token budget ran out before the policy finished; it gets
    the configured no-verdict terminal reward (-0.2 in ScaleCUA).
    QUARANTINED: the infrastructure caused the end (container died, browser crashed,
    server unresponsive, setup failed). The episode leaves its group before advantages.
    """

    SUCCESS = "success"
    FAILURE = "failure"
    NO_VERDICT = "no_verdict"
    QUARANTINED = "quarantined"


class FaultKind(str, enum.Enum):
    """Infrastructure faults that quarantine an episode."""

    CONTAINER_EXITED = "container exited"
    OOM_KILLED = "OOM-killed"
    SERVER_UNRESPONSIVE = "server unresponsive"
    SERVER_ERROR = "server error"
    SETUP_FAILED = "setup failed"
    JUDGE_FAILED = "judge failed"
    ENGINE_FAILED = "engine failed"  # the rollout engine died mid-episode
    BROWSER_CRASHED = "browser crashed"  # the (shared) browser process died under the episode
    RENDERER_CRASHED = "renderer crashed"  # a renderer process died, with every page it hosted
    PROCESS_LIMIT = "process limit reached"  # the environment's pids limit refused a fork
    WORK_TREE_FULL = "work tree full"  # the environment's size-capped work tree filled up
    JUDGE_TAMPERED = "judge output tampered"  # something besides the judge wrote a verdict
    # The environment's main process (a desktop's server, the code runner's reaper) ended cleanly
    # or on a catchable signal mid-episode: only a process inside the container does that (the
    # host removes containers with SIGKILL, between episodes).
    SERVER_STOPPED = "server stopped in the environment"
    PAGE_LEFT_TASK = "page left its task"  # a MiniWoB page navigated away from its task's document
    APP_SERVER_CRASHED = "application server crashed"  # the shared web application's server died


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: FaultKind
    detail: str = ""

    @property
    def reason(self) -> str:
        """The quarantine reason recorded on the episode, e.g. 'container exited: status 137'."""
        return f"{self.kind.value}: {self.detail}" if self.detail else self.kind.value


@dataclasses.dataclass
class Turn:
    """One agent turn: the observation it saw, and the response the engine sampled.

    response_ids / response_logprobs are exactly what the engine produced (token-in,
    token-out); they are never re-tokenized. `images` are the screenshots of this
    turn's observation (uint8 [H, W, 3]); `observation_text` is the text beside them.
    """

    observation_text: str
    images: list[np.ndarray]
    response_ids: np.ndarray  # int32 [R]
    response_logprobs: np.ndarray  # float32 [R]
    response_text: str = ""
    action: Any = None  # the parsed action (cua_jax.envs.actions), or None if invalid
    reward: float = 0.0
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Episode:
    """A whole rollout of one task: its turns, outcome and provenance."""

    episode_id: str
    task_id: str
    group_id: int
    instruction: str
    turns: list[Turn]
    reward: float = 0.0
    status: EpisodeStatus = EpisodeStatus.FAILURE
    fault: Fault | None = None  # the infrastructure fault that ended it (quarantined, or scored as the agent's)
    policy_version: int = 0
    system_prompt: str = ""
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def quarantine_reason(self) -> str | None:
        """Why a quarantined episode was quarantined (its fault's reason, as logs record it)."""
        return self.fault.reason if self.fault is not None and self.status is EpisodeStatus.QUARANTINED else None

    def __setstate__(self, state: dict[str, Any]) -> None:
        # An episode pickled before episodes carried a Fault (a checkpoint's buffer) holds its
        # quarantine reason, "<kind>: <detail>": its fault is read back from it.
        reason = state.pop("quarantine_reason", None)
        if reason is not None and "fault" not in state:
            head, _, detail = reason.partition(": ")
            kinds = {kind.value: kind for kind in FaultKind}
            state["fault"] = Fault(kinds[head], detail) if head in kinds else Fault(FaultKind.SERVER_ERROR, reason)
        self.__dict__.update(state)

    @property
    def num_turns(self) -> int:
        return len(self.turns)


@dataclasses.dataclass
class ImageSpan:
    """Where an image's placeholder tokens sit in a training item's ids.

    `start`/`end` index the item's ids ([start, end) covers the image-pad tokens);
    `turn` and `index` locate the image in its episode (episode.turns[turn].images[index]);
    `grid_thw` is the processor's patch grid (t, h, w) before spatial merging.
    """

    start: int
    end: int
    turn: int
    index: int
    grid_thw: tuple[int, int, int]


@dataclasses.dataclass
class TrainingItem:
    """One sequence the learner trains on, cut from an episode by a segmenter.

    ids, loss_mask and rollout_logprobs are aligned [L] arrays: loss_mask is 1 exactly
    on response tokens this item trains (each response token of an episode is trained
    in exactly one item), rollout_logprobs holds the engine's logprob there and 0 elsewhere.
    """

    ids: np.ndarray  # int32 [L]
    loss_mask: np.ndarray  # int32 [L], 0/1
    rollout_logprobs: np.ndarray  # float32 [L]
    images: list[ImageSpan]
    episode_id: str
    group_id: int
    step_indices: tuple[int, ...]  # the turns whose responses this item trains

    def __len__(self) -> int:
        return int(self.ids.shape[0])
