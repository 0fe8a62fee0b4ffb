"""A task-pool simulator: latent task difficulty and a simple learning model, for comparing
samplers at a fixed rollout budget without running a policy.

The model (all quantities are logits):

  success probability of task i:   p_i = sigmoid(s_d + u_i - b_i)
    b_i  latent difficulty, b_i = tier_difficulty[tier_i] + N(0, difficulty_noise^2);
    s_d  skill of the policy in task i's domain d, initially N(0, domain_skill_spread^2);
    u_i  skill specific to task i, initially 0.
  rollouts of a group are independent Bernoulli(p_i) draws.

  learning: one training step moves a total logit mass of at most `step_gain`, shared out
  like a token-mean loss over the whole batch shares the gradient: group k of the batch gets
      g_k = step_gain * informative_k * attempts_k / (sum of attempts over the batch),
  so only *informative* groups (mixed outcomes, the only ones with non-zero group-relative
  advantage) teach, and degenerate groups (all-success, all-fail) dilute the step. A group
  that is informative only thanks to a replayed cached success (an off-policy sample) gets
  replay_gain * g_k. The task keeps u_i += g_k, and a share `transfer` of it spreads over
  the domain: s_d += transfer * g_k / (number of training tasks in d). Learning saturates
  on its own: a mastered task yields all-success groups and stops moving. The total learning
  a rollout budget buys is thus proportional to the share of rollouts spent in informative
  groups, which is what the samplers compete on.

  held-out tasks: drawn like the training tasks (same domains and tiers) but never
  trained; they move only through the domain skills s_d, i.e. through transfer.

The simulator owns its random generator; `state_dict()` carries it with the skills, so a
restored simulator continues the exact same rollout stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cua_jax.checks import require_at_least
from cua_jax.tasks.pool import GroupOutcome, PoolTask

SIMULATED_TASK_KIND = "simulated"


@dataclasses.dataclass(frozen=True)
class SimulatorConfig:
    """Shape of the simulated pool and the learning model (see the module docstring)."""

    num_domains: int = 6
    train_tasks_per_domain: int = 100
    held_out_tasks_per_domain: int = 30
    tier_difficulty: tuple[float, ...] = (-3.0, -0.5, 2.0, 5.0)
    difficulty_noise: float = 0.75
    domain_skill_spread: float = 0.5
    infeasible_fraction: float = 0.05
    step_gain: float = 6.0
    transfer: float = 0.5
    replay_gain: float = 0.5

    def __post_init__(self):
        require_at_least(self, ("num_domains", "train_tasks_per_domain"), 1)
        if self.held_out_tasks_per_domain < 0:
            raise ValueError("SimulatorConfig.held_out_tasks_per_domain must be >= 0")
        if not self.tier_difficulty:
            raise ValueError("SimulatorConfig.tier_difficulty needs at least one tier")
        for name in ("infeasible_fraction", "transfer", "replay_gain"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"SimulatorConfig.{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.step_gain < 0 or self.difficulty_noise < 0 or self.domain_skill_spread < 0:
            raise ValueError("SimulatorConfig.step_gain, difficulty_noise, domain_skill_spread must be >= 0")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class TaskPoolSimulator:
    """Training tasks (for a `TaskPool`), held-out tasks, grouped rollouts and learning."""

    def __init__(self, config: SimulatorConfig = SimulatorConfig(), seed: int = 0):
        self.config = config
        self._rng = np.random.default_rng(seed)
        cfg, rng = config, self._rng
        num_tiers = len(cfg.tier_difficulty)

        def draw(per_domain: int):
            domain = np.repeat(np.arange(cfg.num_domains), per_domain)
            tier = rng.integers(0, num_tiers, size=domain.shape[0])
            noise = rng.normal(0.0, cfg.difficulty_noise, size=domain.shape[0])
            return domain, tier, np.asarray(cfg.tier_difficulty)[tier] + noise

        self.domain, self.tier, self.difficulty = draw(cfg.train_tasks_per_domain)
        self.held_out_domain, self.held_out_tier, self.held_out_difficulty = draw(cfg.held_out_tasks_per_domain)
        self.feasible = rng.random(self.domain.shape[0]) >= cfg.infeasible_fraction
        self.domain_skill = rng.normal(0.0, cfg.domain_skill_spread, size=cfg.num_domains)
        self.task_skill = np.zeros(self.domain.shape[0])
        self.task_ids = [f"sim-{i:05d}" for i in range(self.domain.shape[0])]
        self._index = {task_id: i for i, task_id in enumerate(self.task_ids)}
        self._domain_size = np.bincount(self.domain, minlength=cfg.num_domains)
        self.rollouts = 0  # episodes run so far (training, pilot and calibration alike)
        self._trajectories = 0

    def pool_tasks(self) -> list[PoolTask]:
        """The training tasks as pool tasks (payload kind "simulated")."""
        return [
            PoolTask(
                task_id=self.task_ids[i],
                domain=f"domain-{self.domain[i]}",
                tier=int(self.tier[i]),
                feasible=bool(self.feasible[i]),
                payload={"kind": SIMULATED_TASK_KIND, "difficulty": float(self.difficulty[i])},
            )
            for i in range(len(self.task_ids))
        ]

    def _indices(self, task_ids: Sequence[str]) -> np.ndarray:
        try:
            return np.array([self._index[t] for t in task_ids], dtype=np.int64)
        except KeyError as err:
            raise KeyError(f"task {err.args[0]!r} is not a training task of this simulator") from None

    def pass_rates(self, task_ids: Sequence[str] | None = None) -> np.ndarray:
        """float [K] true success probabilities of training tasks (all of them if None)."""
        p = _sigmoid(self.domain_skill[self.domain] + self.task_skill - self.difficulty)
        return p if task_ids is None else p[self._indices(task_ids)]

    def held_out_pass_rates(self) -> np.ndarray:
        """float [H] true success probabilities of the held-out tasks (no task skill)."""
        return _sigmoid(self.domain_skill[self.held_out_domain] - self.held_out_difficulty)

    def run_groups(self, task_ids: Sequence[str], group_size: int) -> list[GroupOutcome]:
        """One group of `group_size` independent rollouts per task id (a `RunGroups`).

        A group with a success carries an opaque successful trajectory for the replay cache.
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        successes = self._rng.binomial(group_size, self.pass_rates(task_ids))
        self.rollouts += group_size * len(task_ids)
        outcomes = []
        for task_id, s in zip(task_ids, successes):
            trajectory = None
            if s:
                trajectory = ("simulated-trajectory", task_id, self._trajectories)
                self._trajectories += 1
            outcomes.append(GroupOutcome(task_id, int(s), group_size, trajectory))
        return outcomes

    def learn(self, outcomes: Sequence[GroupOutcome], replayed: Sequence[bool] | None = None) -> None:
        """Applies one training step on the given groups (the learning model above).

        Args:
          outcomes: [G] the trained groups.
          replayed: optional bool [G]: the group had one failure swapped for a cached success.
        """
        if not outcomes:
            return
        replayed = np.zeros(len(outcomes), bool) if replayed is None else np.asarray(replayed, bool)
        successes = np.array([o.successes for o in outcomes]) + replayed
        attempts = np.array([o.attempts for o in outcomes])
        informative = (successes > 0) & (successes < attempts)
        replay_only = replayed & (np.array([o.successes for o in outcomes]) == 0)
        share = attempts / max(int(attempts.sum()), 1)
        gain = self.config.step_gain * share * informative * np.where(replay_only, self.config.replay_gain, 1.0)
        index = self._indices([o.task_id for o in outcomes])
        np.add.at(self.task_skill, index, gain)
        domain_gain = np.zeros_like(self.domain_skill)
        np.add.at(domain_gain, self.domain[index], gain)
        self.domain_skill += self.config.transfer * domain_gain / self._domain_size

    def state_dict(self) -> dict[str, Any]:
        return {
            "domain_skill": self.domain_skill.copy(),
            "task_skill": self.task_skill.copy(),
            "rng": self._rng.bit_generator.state,
            "rollouts": self.rollouts,
            "trajectories": self._trajectories,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.domain_skill = np.array(state["domain_skill"], dtype=np.float64)
        self.task_skill = np.array(state["task_skill"], dtype=np.float64)
        self._rng.bit_generator.state = state["rng"]
        self.rollouts = int(state["rollouts"])
        self._trajectories = int(state["trajectories"])
