"""Evaluate a policy on a task suite: k samples per task x seed, tables per task and domain.

    python -m experiments.evaluate --policy=oracle --suite=miniwob --k=1 --seeds=3 --out=evals/oracle
    python -m experiments.evaluate --policy=runs/default --step=16 --suite=browsergym --k=4 \\
        --turn_budgets=15,50,100 --out=evals/default

--policy: "random", "oracle", a Hugging Face policy directory, or a training run's workdir
(with --step, default its latest checkpoint; its own config then replaces --config).
--suite: miniwob, browsergym, webgum (the 56 tasks of WebGUM and HTML-T5), desktop, os, apps,
osworld (OSWorld's own task files: --osworld names its evaluation_examples/examples; the tasks
that run here on the osworld_apps image, the rest listed under "Not run" with the reason, as
`python -m experiments.tasks check` gives it; --mirror the download mirror its cloud files are
read from), or a folder of OSWorld-format tasks.
--pilot: CANOPY's pilot pass instead (`cua_jax.eval.pilot`): config.sampler.pilot.group_size
samples of each of the config's training tasks on --seeds training seeds; prints each tier's
signal coverage at rollout.group_size and the group-size floor for sampler.pilot.target, and
writes <out>/pilot.json, which a run reads through --config.sampler.pilot.file.
Workers: --workers rollout workers (in this process, or Ray actors with
--config.rollout.worker_backend=ray for a model policy), each running up to
config.eval.concurrent_groups groups per call with batched generation.
Each turn budget x temperature is one evaluation in <out>/turns_<T>_temperature_<t>/:
results.jsonl (one line per episode, so a killed run started again resumes), results.md,
tasks.csv, domains.csv, summary.json (`cua_jax.eval.harness`).
"""

from __future__ import annotations

import dataclasses
import json

from absl import app, flags
from ml_collections import config_flags

from cua_jax.compilation import use_compilation_cache

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/evaluate.py", "Run settings the policy follows.", lock_config=True
)
_POLICY = flags.DEFINE_string(
    "policy", None, "random | oracle | a Hugging Face directory | a run's workdir.", required=True
)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step of a run's workdir (default: the latest).")
_SUITE = flags.DEFINE_string(
    "suite", "miniwob", "miniwob | browsergym | webgum | desktop | os | apps | osworld | a task folder."
)
_OSWORLD = flags.DEFINE_string("osworld", None, "OSWorld's evaluation_examples/examples (--suite=osworld).")
_MIRROR = flags.DEFINE_string("mirror", None, "The download mirror (python -m experiments.tasks mirror) to read from.")
_K = flags.DEFINE_integer("k", 1, "Samples (episodes) per task and seed.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds per task (the suite's first ones).")
_TURNS = flags.DEFINE_list("turn_budgets", [], "Turn budgets to sweep (default: config.eval.max_turns).")
_TEMPERATURES = flags.DEFINE_list("temperatures", [], "Temperatures to sweep (default: config.eval.temperature).")
_OUT = flags.DEFINE_string("out", None, "Output folder (resumed when it holds results).", required=True)
_WORKERS = flags.DEFINE_integer("workers", 1, "Rollout workers (one group at a time each).")
_TASKS = flags.DEFINE_list("tasks", [], "Only these tasks of the suite (default: all).")
_MAX_RERUNS = flags.DEFINE_integer("max_reruns", 2, "Reruns of a quarantined sample before it is given up.")
_PILOT = flags.DEFINE_bool("pilot", False, "Run CANOPY's pilot pass on the config's training tasks.")


def _numbers(values, kind, name):
    try:
        return [kind(v) for v in values]
    except ValueError:
        raise app.UsageError(f"--{name} must be a comma-separated list of {kind.__name__}s, got {values}") from None


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
    from cua_jax.eval.harness import sweep
    from cua_jax.eval.suites import load_suite, osworld_suite
    from cua_jax.observe.logs import quiet_library_logging
    from cua_jax.tasks.fetch import downloads_from
    from cua_jax.train.build import local_ray
    from cua_jax.train.settings import rollout_settings
    from experiments.policies import load_eval_policy, worker_factory

    quiet_library_logging()
    if _PILOT.value:
        return pilot()
    # the mirror is read by every download (cua_jax.tasks.fetch), in this process and its workers
    with downloads_from(_MIRROR.value or None):
        try:
            if _SUITE.value == "osworld":
                if not _OSWORLD.value:
                    raise app.UsageError(
                        "--suite=osworld reads OSWorld's task files: pass --osworld=<its examples folder>"
                    )
                suite = osworld_suite(_OSWORLD.value, _MIRROR.value)
            else:
                suite = load_suite(_SUITE.value)
            if _TASKS.value:
                suite = suite.restricted(_TASKS.value)
            policy = load_eval_policy(_POLICY.value, _CONFIG.value, _STEP.value)
            turns = _numbers(_TURNS.value, int, "turn_budgets") or [policy.config.eval.max_turns]
            temperatures = _numbers(_TEMPERATURES.value, float, "temperatures") or [policy.config.eval.temperature]
            with local_ray(rollout_settings(policy.config)):
                summaries = sweep(
                    worker_factory(policy, suite, _WORKERS.value, group_size=_K.value),
                    policy,
                    suite,
                    suite.seeds(_SEEDS.value),
                    _K.value,
                    _OUT.value,
                    turns,
                    temperatures,
                    max_reruns=_MAX_RERUNS.value,
                    confidence=policy.config.eval.confidence,
                    groups_per_call=policy.config.eval.concurrent_groups,
                )
        except ValueError as error:
            raise app.UsageError(str(error)) from error
    for folder, summary in summaries.items():
        o = summary["overall"]
        print(
            f"{folder}: success {o['success_rate']:.3f} ({o['successes']}/{o['episodes']}) "
            f"[{o['ci_low']:.3f}, {o['ci_high']:.3f}], pass@{summary['k']} {o['pass@k']:.3f}, "
            f"quarantined {o['quarantined']}, {len(summary['skipped'])} tasks not run"
        )
    print(json.dumps({"out": _OUT.value, "evaluations": sorted(summaries)}))


def pilot() -> None:
    """CANOPY's pilot pass: the config's training tasks, config.sampler.pilot.group_size samples
    per (task, training seed), the tier coverage report and <out>/pilot.json."""
    from cua_jax.eval.harness import evaluate
    from cua_jax.eval.pilot import pilot_report, report_lines, write_pilot_file
    from cua_jax.eval.suites import Suite
    from cua_jax.tasks.sources import TaskCatalog
    from cua_jax.train.build import local_ray
    from cua_jax.train.settings import TrainSettings
    from experiments.policies import load_eval_policy, worker_factory

    if _K.present or _TURNS.value or _TEMPERATURES.value:
        raise app.UsageError(
            "--pilot takes its samples from config.sampler.pilot.group_size and runs the training "
            "agent's budget; drop --k, --turn_budgets and --temperatures"
        )
    try:
        policy = load_eval_policy(_POLICY.value, _CONFIG.value, _STEP.value)
        c = policy.config
        if c.eval.rope_scaling:  # the pilot estimates training's pass rates: the model's own rope
            c = c.copy_and_resolve_references()
            c.eval.rope_scaling = 0.0
            policy = dataclasses.replace(policy, config=c)
        settings = TrainSettings.from_config(c)
        use_compilation_cache(c.compilation_cache_dir)
        tasks = list(_TASKS.value or settings.training_tasks)
        unknown = sorted(set(tasks) - set(settings.training_tasks))
        if unknown:
            raise ValueError(f"--tasks {unknown} are not training tasks of the config")
        # Training seeds: the pilot estimates the pass rates the sampler will see.
        suite = Suite("pilot", TaskCatalog([settings.catalog[t] for t in tasks]), seed_start=0)
        k = settings.pilot.group_size
        make_workers = worker_factory(policy, suite, _WORKERS.value, group_size=k)
        with local_ray(settings.rollout):
            workers = make_workers(settings.agent.max_turns, settings.agent.temperature)
            try:
                summary = evaluate(
                    workers,
                    policy,
                    suite,
                    suite.seeds(_SEEDS.value),
                    k,
                    _OUT.value,
                    max_reruns=_MAX_RERUNS.value,
                    confidence=c.eval.confidence,
                    groups_per_call=c.eval.concurrent_groups,
                    title=f"pilot of {policy.name}",
                )
            finally:
                for worker in workers:
                    worker.shutdown()
        report = pilot_report(
            summary["records"],
            {t: settings.catalog[t].tier for t in tasks},
            c.rollout.group_size,
            settings.pilot.target,
            k,
            policy.name,
        )
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    print("\n".join(report_lines(report)))
    print(
        json.dumps(
            {
                "out": _OUT.value,
                "pilot_file": write_pilot_file(_OUT.value, report),
                "group_size_floor": report["group_size_floor"],
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
