"""Task-pool simulator: the documented learning model."""

import numpy as np
import pytest

from cua_jax.tasks.pool import GroupOutcome
from cua_jax.tasks.simulator import SimulatorConfig, TaskPoolSimulator


def test_learning_model_moves_only_informative_groups():
    cfg = SimulatorConfig(num_domains=2, train_tasks_per_domain=10, held_out_tasks_per_domain=4)
    sim = TaskPoolSimulator(cfg, seed=0)
    a, b, c = sim.task_ids[0], sim.task_ids[1], sim.task_ids[12]  # a, b in domain 0; c in domain 1
    task_before, domain_before = sim.task_skill.copy(), sim.domain_skill.copy()
    held_out_before = sim.held_out_pass_rates()
    outcomes = [GroupOutcome(a, 3, 8), GroupOutcome(b, 8, 8), GroupOutcome(c, 0, 8)]
    sim.learn(outcomes, replayed=[False, False, True])

    gain_a = cfg.step_gain * 8 / 24
    gain_c = cfg.replay_gain * cfg.step_gain * 8 / 24  # informative only through the replay
    assert sim.task_skill[0] - task_before[0] == pytest.approx(gain_a)
    assert sim.task_skill[1] == task_before[1]  # all-success group: no signal
    assert sim.task_skill[12] - task_before[12] == pytest.approx(gain_c)
    np.testing.assert_allclose(
        sim.domain_skill - domain_before, [cfg.transfer * gain_a / 10, cfg.transfer * gain_c / 10]
    )
    assert np.all(sim.held_out_pass_rates() > held_out_before)  # transfer reaches held-out tasks
