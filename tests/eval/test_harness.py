"""The evaluation harness on real MiniWoB++ capsules (system Chromium): the oracle and random
policies with k > 1 on 2 tasks x 2 seeds, a quarantined episode run again, a resume after
the results file was cut mid-way, and the suites."""

from __future__ import annotations

import collections
import json
import os

import pytest

from cua_jax.eval.harness import Job, _take_jobs, evaluate, pending_jobs, read_results, sweep
from cua_jax.eval.suites import SEED_START, load_suite
from cua_jax.train.settings import TrainSettings
from cua_jax.types import EpisodeStatus
from experiments.configs import evaluate as evaluate_config
from experiments.policies import (
    EvalPolicy,
    build_eval_workers,
    eval_settings,
    load_eval_policy,
    random_action,
    worker_factory,
)
from tests.support.faults import CapsuleClosingEnvironment, FaultSwitch

TASKS = ["click-button", "enter-text"]
SEEDS = [SEED_START, SEED_START + 1]


def config(max_turns):
    c = evaluate_config.get_config()
    c.eval.max_turns = max_turns
    return c


def agent_of(policy):
    return TrainSettings.from_config(policy.config).eval_agent


@pytest.fixture(scope="module")
def suite():
    return load_suite("miniwob").restricted(TASKS)


@pytest.fixture(scope="module")
def oracle(suite):
    switch = FaultSwitch()

    def wrap(env):
        return CapsuleClosingEnvironment(env, switch)

    policy = load_eval_policy("oracle", config(4))
    workers = build_eval_workers(policy, suite, agent_of(policy), 1, wrap, group_size=2)
    try:
        yield policy, workers, switch
    finally:
        for worker in workers:
            worker.shutdown()


@pytest.mark.browser
def test_oracle_k2_tables_and_resume_after_a_cut(oracle, suite, tmp_path):
    policy, workers, _ = oracle
    first = evaluate(workers, policy, suite, SEEDS, 2, tmp_path / "a", progress=False)
    assert first["overall"]["episodes"] == 8 and first["overall"]["success_rate"] == 1.0
    assert first["tasks"]["enter-text"]["pass@k"] == 1.0 and first["overall"]["quarantined"] == 0
    assert set(first["tasks"]) == set(TASKS) and first["domains"]["miniwob"]["problems"] == 4
    for name in ("results.md", "tasks.csv", "domains.csv", "summary.json"):
        assert os.path.exists(tmp_path / "a" / name)

    # A kill mid-way: three whole records and half of the fourth survive.
    path = tmp_path / "a" / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    assert len(read_results(path)) == 3
    kept = {(r["task"], r["seed"], r["sample"]) for r in read_results(path)}
    assert sum(len(j.samples) for j in pending_jobs(read_results(path), TASKS, SEEDS, 2, 2)) == 5
    again = evaluate(workers, policy, suite, SEEDS, 2, tmp_path / "a", progress=False)
    records = read_results(path)
    assert len(records) == 8  # the three finished entries were skipped, not run again
    assert {(r["task"], r["seed"], r["sample"]) for r in records[:3]} == kept
    assert again["tasks"] == first["tasks"] and again["domains"] == first["domains"]
    # Run once more: nothing is left to run.
    evaluate(workers, policy, suite, SEEDS, 2, tmp_path / "a", progress=False)
    assert len(read_results(path)) == 8


@pytest.mark.browser
def test_quarantined_episode_is_counted_apart_and_run_again(oracle, suite, tmp_path):
    policy, workers, switch = oracle
    switch.arm()
    summary = evaluate(workers, policy, suite.restricted(["enter-text"]), SEEDS[:1], 2, tmp_path, progress=False)
    records = read_results(tmp_path / "results.jsonl")
    quarantined = [r for r in records if r["status"] == EpisodeStatus.QUARANTINED.value]
    assert len(quarantined) == 1 and len(records) == 3
    rerun = [r for r in records if r["sample"] == quarantined[0]["sample"] and r is not quarantined[0]]
    assert rerun and rerun[0]["attempt"] == 1 and rerun[0]["success"]
    assert summary["overall"]["quarantined"] == 1 and summary["overall"]["episodes"] == 2
    assert summary["overall"]["given_up"] == 0 and summary["overall"]["success_rate"] == 1.0

    # With no reruns allowed, the quarantined sample is given up, not scored.
    switch.arm()
    capped = evaluate(
        workers,
        policy,
        suite.restricted(["enter-text"]),
        SEEDS[1:],
        2,
        tmp_path / "capped",
        max_reruns=0,
        progress=False,
    )
    assert capped["overall"]["given_up"] == 1 and capped["overall"]["episodes"] == 1


@pytest.mark.browser
def test_random_policy_k2_and_a_turn_budget_sweep(suite, tmp_path):
    policy = load_eval_policy("random", config(2))
    # Four groups per worker call, generation batched across them.
    summaries = sweep(
        worker_factory(policy, suite, 1, group_size=2),
        policy,
        suite,
        SEEDS,
        2,
        tmp_path,
        [1, 2],
        [1.0],
        progress=False,
        groups_per_call=4,
    )
    assert sorted(summaries) == ["turns_1_temperature_1", "turns_2_temperature_1"]
    for folder, summary in summaries.items():
        turns = int(folder.split("_")[1])
        records = read_results(tmp_path / folder / "results.jsonl")
        # A random key or click may navigate the page away, a fault of the environment: quarantined, run again.
        quarantined = sum(r["status"] == EpisodeStatus.QUARANTINED.value for r in records)
        assert summary["overall"]["episodes"] == 8 and summary["overall"]["quarantined"] == quarantined
        assert len(records) == 8 + quarantined and all(r["turns"] <= turns for r in records)
        assert 0.0 <= summary["overall"]["pass@k"] <= 1.0
    # The actions are seeded per request: the same evaluation, one group per call, replays the
    # same episodes.
    sweep(
        worker_factory(policy, suite, 1, group_size=2),
        policy,
        suite,
        SEEDS,
        2,
        tmp_path / "again",
        [1],
        [1.0],
        progress=False,
    )

    def outcomes(folder):
        return sorted(
            (r["task"], r["seed"], r["sample"], r["attempt"], r["status"], r["turns"])
            for r in read_results(folder / "turns_1_temperature_1" / "results.jsonl")
        )

    assert outcomes(tmp_path) == outcomes(tmp_path / "again")


def test_jobs_taken_per_call_share_their_sample_count():
    pending = collections.deque([Job("a", 0, (0, 1)), Job("b", 0, (1,)), Job("c", 0, (0, 1)), Job("d", 0, (0, 1))])
    assert [j.task for j in _take_jobs(pending, 2)] == ["a", "c"]
    assert [j.task for j in pending] == ["b", "d"]  # the skipped job keeps its place
    assert [j.task for j in _take_jobs(pending, 8)] == ["b"] and [j.task for j in _take_jobs(pending, 8)] == ["d"]


def test_suites_and_policy_errors():
    import numpy as np

    from cua_jax.envs import actions as A
    from cua_jax.envs.miniwob import task_names
    from cua_jax.envs.miniwob_oracle import ORACLE_TASKS

    miniwob = load_suite("miniwob")
    assert miniwob.task_ids == list(task_names()) and not miniwob.skipped
    browsergym = load_suite("browsergym")
    assert len(browsergym.task_ids) + len(browsergym.skipped) == 125
    webgum = load_suite("webgum")
    assert len(webgum.task_ids) + len(webgum.skipped) == 56 and set(webgum.task_ids) <= set(browsergym.task_ids)
    desktop = load_suite("desktop")
    assert desktop.catalog.kinds == {"desktop"}
    random_policy = load_eval_policy("random", config(4))
    settings = eval_settings(random_policy, desktop, agent_of(random_policy), 1, group_size=6)
    assert settings.kind_configs["desktop"].size == 6 and settings.catalog is desktop.catalog
    with pytest.raises(ValueError, match="neither one of"):
        load_suite("no-such-suite")
    with pytest.raises(ValueError, match="has no task"):
        miniwob.restricted(["no-such-task"])
    oracle = load_eval_policy("oracle", config(4))
    assert oracle.unsupported(miniwob.catalog["click-button"]) is None
    unscripted = next(t for t in miniwob.task_ids if t not in ORACLE_TASKS)
    assert "no script" in oracle.unsupported(miniwob.catalog[unscripted])
    with pytest.raises(ValueError, match="neither one of"):
        load_eval_policy("nonsense", config(4))
    # The MiniWoB oracle reads the page from the prompt: without the DOM text its tasks are not
    # run, each with that reason (a web application task's recorded solution needs none).
    blind = config(4)
    blind.env.include_dom_text = False
    assert "include_dom_text" in load_eval_policy("oracle", blind).unsupported(miniwob.catalog["click-button"])
    blind.env.observation = "text"
    with pytest.raises(ValueError, match="observation='screenshot'"):
        load_eval_policy("oracle", blind)
    rng = np.random.default_rng(0)
    for _ in range(200):  # every random action renders and parses back to itself
        action = random_action(rng)
        assert A.parse_arguments(json.loads(A.render_action(action).split("\n")[1])["arguments"]) == action
    assert EvalPolicy("random", config(1)).scripted
    # The no-op policy declares the task done on its first turn.
    from cua_jax.context.tokenizer import load_processor
    from cua_jax.rollout.engine import GenerationRequest, SamplingConfig
    from experiments.policies import ScriptedEngineFactory

    assert load_eval_policy("noop", config(1)).scripted
    engine = ScriptedEngineFactory("noop")()
    [reply] = engine.generate([GenerationRequest(np.zeros(3, np.int32))], SamplingConfig(max_new_tokens=64))
    text = load_processor(None)[0].decode(reply.token_ids[:-1].tolist())
    assert A.parse_action(text, "coordinates") == A.Done()


@pytest.mark.browser
@pytest.mark.slow
def test_hugging_face_policy_directory(tmp_path):
    """The shipped base (a Hugging Face directory) as --policy: loaded as model.init_from, run
    on the JAX sampler."""
    c = config(1)
    c.env.action_space = "elements"  # the space the base was trained in
    suite = load_suite("miniwob").restricted(["click-test"])
    policy = load_eval_policy("experiments/bases/miniwob-elements", c)
    assert policy.config.model.name == "qwen3_vl" and not policy.scripted
    summaries = sweep(
        worker_factory(policy, suite, 1, group_size=2),
        policy,
        suite,
        SEEDS[:1],
        2,
        tmp_path,
        [1],
        [1.0],
        progress=False,
    )
    overall = summaries["turns_1_temperature_1"]["overall"]
    assert overall["episodes"] + overall["given_up"] == 2 and overall["problems"] == 1


@pytest.mark.browser
@pytest.mark.slow
def test_training_run_workdir_as_policy(tmp_path):
    """A training run's workdir as --policy: its checkpoint and its own config."""
    from experiments.configs import tiny
    from tests.support.trainer import start_trainer

    run = tiny.get_config()
    run.workdir = str(tmp_path / "run")
    with start_trainer(run) as trainer:
        trainer.train_step()
        trainer.save()
    with pytest.raises(ValueError, match="no checkpoint of step 7"):
        load_eval_policy(run.workdir, config(1), step=7)
    policy = load_eval_policy(run.workdir, config(1))
    assert policy.step == 1 and policy.name == "run@1" and policy.config.model.num_layers == 2
    suite = load_suite("miniwob").restricted(["click-button"])
    summaries = sweep(
        worker_factory(policy, suite, 1, group_size=2),
        policy,
        suite,
        SEEDS[:1],
        2,
        tmp_path / "eval",
        [1],
        [1.0],
        progress=False,
    )
    assert summaries["turns_1_temperature_1"]["overall"]["problems"] == 1


def test_summary_steps_and_the_score_without_infeasible_tasks(tmp_path):
    """OSWorld reports its score with and without its infeasible tasks, and the steps used:
    the summary's "overall_feasible" row counts the feasible tasks alone, "steps" the mean
    turns of the scored episodes per domain (a quarantined one is not scored)."""
    from cua_jax.eval.harness import summarize, write_tables
    from cua_jax.eval.suites import Suite
    from cua_jax.tasks.sources import SourceTask, TaskCatalog

    catalog = TaskCatalog(
        [SourceTask("a", "desktop", "os", 0, True, None), SourceTask("b", "desktop", "os", 0, False, None)]
        + [SourceTask("c", "desktop", "chrome", 0, True, None)]
    )

    def record(task, domain, status, turns):
        success = status == "success"
        return dict(task=task, domain=domain, seed=0, sample=0, status=status, success=success, turns=turns)

    records = [
        record("a", "os", "failure", 15),
        record("b", "os", "success", 1),  # infeasible: declared failure at once
        record("c", "chrome", "success", 4),
        record("c", "chrome", "quarantined", 2),
    ]
    summary = summarize(records, 1, 0.95, title="t", suite=Suite("s", catalog), seeds=[0], skipped={})
    assert summary["overall"]["successes"] == 2 and summary["overall"]["problems"] == 3
    assert summary["overall_feasible"]["successes"] == 1 and summary["overall_feasible"]["problems"] == 2
    assert summary["steps"] == {"all": 20 / 3, "chrome": 4.0, "os": 8.0}
    write_tables(tmp_path, summary)
    text = (tmp_path / "results.md").read_text()
    assert "| all, feasible tasks only | 2 |" in text
    assert "Steps used (mean turns per scored episode): all 6.67 | chrome 4.00 | os 8.00" in text
