"""VeriGen task synthesis: python -m experiments.synthesize --config=experiments/configs/verigen.py

Starts a desktop pool, runs the VeriGen loop with a progress line until the target number
of tasks is accepted, writes the tasks (tasks/*.json, judges/*.py), re-runs every accepted
task from scratch on a fresh environment (initial state must score 0, the reference
solution 1), composes harder tasks from the verified ones, audits overlap against the
desktop suite, and writes report.json and audit.json under config.out_dir.

With config.from_run.workdir set, a training run feeds synthesis instead of the proposer:
its episode log gives the real pass rates of the tasks it trained on (from_run.task_dirs);
failed tasks become easier sub-tasks at the earliest deviation of their unsolved episodes,
solved ones are composed into harder tasks, and what the VeriGen loop accepts of them is
written to <out_dir>/from_run/ (then re-run from scratch and audited as above).
"""

from __future__ import annotations

import concurrent.futures
import json
import pathlib
import sys
import time

from absl import app
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/verigen.py", "VeriGen configuration.", lock_config=True
)


def progress_line(report) -> None:
    summary = report.summary()
    sys.stderr.write(
        f"\r[verigen] candidates {summary['candidates']:4d}  accepted {summary['accepted']:4d}  "
        f"executable {100 * summary['executable_rate']:5.1f}%  {report.seconds:7.1f}s"
    )
    sys.stderr.flush()


def build_roles(config, probe):
    """(proposer, judger, checker, fixer, cost) for config.roles."""
    from cua_jax.tasks.verigen import llm, roles, templates

    if config.roles == "programmatic":
        proposer = templates.TemplateProposer(seed=config.seed, defect_rate=config.defect_rate)
        checker = roles.ScriptedChecker(probe, judge_timeout_cap=config.loop.judge_timeout_cap)
        return proposer, roles.ProgrammaticJudger(), checker, roles.TemplateFixer(), lambda: 0.0
    if config.roles == "llm":
        chat = llm.ChatClient(
            config.llm.base_url,
            config.llm.model,
            config.llm.api_key_env,
            config.llm.timeout,
            config.llm.retries,
            price_prompt=config.llm.price_prompt,
            price_completion=config.llm.price_completion,
        )
        checker = llm.LLMChecker(probe, chat, judge_timeout_cap=config.loop.judge_timeout_cap)
        return llm.LLMProposer(chat), llm.LLMJudger(chat), checker, llm.LLMFixer(chat), chat.ledger.cost
    raise ValueError(f"config.roles must be 'programmatic' or 'llm', got {config.roles!r}")


def verify(candidates, probe, judge_timeout_cap: float, workers: int) -> list[dict]:
    """Re-run each task from scratch (a fresh environment each): 0 before, 1 after the solution."""
    from cua_jax.tasks.verigen.roles import ScriptedChecker

    checker = ScriptedChecker(probe, judge_timeout_cap=judge_timeout_cap)
    with concurrent.futures.ThreadPoolExecutor(workers) as executor:
        results = list(executor.map(checker.check, candidates))
    return [{"id": c.id, "passed": r.passed, "reasons": r.reasons, **r.detail} for c, r in zip(candidates, results)]


def load_run(settings) -> tuple[list, dict]:
    """(episode records from settings.since_step on, tasks by id) of the run settings.workdir."""
    from cua_jax.observe.episode_log import EPISODE_LOG, read_episode_log
    from cua_jax.tasks.verigen import pipeline

    if not settings.task_dirs:
        raise ValueError("config.from_run.task_dirs names no task folder: give the task folders the run trained on")
    path = pathlib.Path(settings.workdir) / EPISODE_LOG
    if not path.is_file():
        raise ValueError(f"no episode log at {path}: config.from_run.workdir must be a training run's workdir")
    records = [r for r in read_episode_log(path) if r.step >= settings.since_step]
    if not records:
        raise ValueError(f"{path} holds no episodes from step {settings.since_step} on")
    return records, pipeline.read_task_dirs(settings.task_dirs)


def synthesize_from_run(config, records, tasks, verigen, judger_chat, out: pathlib.Path) -> dict:
    """Sub-tasks of the run's failed tasks and tasks composed from its solved ones, through
    the VeriGen loop; the accepted ones are written to `out`. Returns the report section."""
    from cua_jax.tasks.verigen import pipeline, trajectory
    from cua_jax.tasks.verigen.similarity import default_embedder

    settings, started = config.from_run, time.monotonic()
    made = trajectory.from_run(
        records,
        tasks,
        default_embedder().encode,
        judger_chat,
        settings.max_pass_rate,
        settings.min_pass_rate,
        config.augment.cluster_threshold,
        settings.max_subtasks,
        settings.max_composed,
    )
    candidates = made.subtasks + made.composed
    with concurrent.futures.ThreadPoolExecutor(max(1, config.workers)) as executor:
        results = list(executor.map(verigen.process, candidates))
    accepted = [r.candidate for r in results if r.accepted]
    pipeline.write_tasks(accepted, out)
    known = [rate for task_id, rate in made.pass_rates.items() if task_id in tasks]
    return {
        "episodes": len(records),
        "tasks": len(known),
        "unknown_tasks": made.unknown_tasks,
        "failed_tasks": sum(rate <= settings.max_pass_rate for rate in known),
        "solved_tasks": sum(rate >= settings.min_pass_rate for rate in known),
        "pass_rates": dict(sorted(made.pass_rates.items())),
        "subtasks": len(made.subtasks),
        "composed": len(made.composed),
        "accepted": len(accepted),
        "accepted_ids": sorted(c.id for c in accepted),
        "rejected": [{"id": r.candidate.id, "reason": r.reason} for r in results if not r.accepted],
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
    config = _CONFIG.value
    from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
    from cua_jax.envs.images import ensure_image
    from cua_jax.tasks.suites.desktop.solutions import SUITE_DIR
    from cua_jax.tasks.verigen import audit, pipeline, trajectory
    from cua_jax.tasks.verigen.knowledge import DESKTOP_KNOWLEDGE
    from cua_jax.tasks.verigen.probe import InteractionProbe
    from cua_jax.tasks.verigen.similarity import default_embedder

    out = pathlib.Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    run = load_run(config.from_run) if config.from_run.workdir else None  # bad input fails before the pool starts
    written = out / "from_run" if run is not None else out
    pool_config = PoolConfig(
        image=ensure_image("desktop"),
        size=config.pool.size,
        cpus=config.pool.cpus,
        memory=config.pool.memory,
        health_interval=None,
    )
    with DockerEnvPool(pool_config) as pool, InteractionProbe(pool) as probe:
        proposer, judger, checker, fixer, cost = build_roles(config, probe)
        loop = pipeline.LoopConfig(
            config.loop.use_rules,
            config.loop.use_judger,
            config.loop.use_fixer,
            config.loop.max_fix_rounds,
            config.loop.candidates_per_call,
        )
        observe = probe.observe_fresh if config.roles == "llm" else None  # templates need no screen
        verigen = pipeline.VeriGen(proposer, judger, checker, fixer, loop, DESKTOP_KNOWLEDGE, cost, observe)
        if run is not None:
            judger_chat = judger.chat if config.roles == "llm" else None
            summary = {"from_run": synthesize_from_run(config, *run, verigen, judger_chat, written)}
        else:
            report = verigen.run(config.target_accepted, config.max_candidates, config.workers, progress_line)
            sys.stderr.write("\n")
            accepted = report.accepted
            pipeline.write_tasks(accepted, out)
            summary = {"synthesis": report.summary()}
        if hasattr(checker, "chat"):
            summary["llm_ledger"] = checker.chat.ledger.summary()

        if config.verify_from_scratch:
            started = time.monotonic()
            written_tasks = pipeline.read_tasks(written)
            rerun = verify(written_tasks, probe, config.loop.judge_timeout_cap, config.workers)
            summary["from_scratch"] = {
                "tasks": len(rerun),
                "passed": sum(r["passed"] for r in rerun),
                "failed": [r for r in rerun if not r["passed"]],
                "distinct_instructions": len({c.instruction for c in written_tasks}),
                "seconds": round(time.monotonic() - started, 1),
            }
            (out / "from_scratch.json").write_text(json.dumps(rerun, indent=1) + "\n")

            # the reference solutions' pass rates on a fresh environment: 1 verified, 0 not
            scratch_rates = {r["id"]: float(r["passed"]) for r in rerun}
            if config.augment.composed and run is None and any(scratch_rates.values()):
                composed = trajectory.compose_solved(
                    accepted,
                    scratch_rates,
                    default_embedder().encode,
                    threshold=config.augment.cluster_threshold,
                    max_tasks=config.augment.composed,
                )
                with concurrent.futures.ThreadPoolExecutor(config.workers) as executor:
                    results = list(executor.map(verigen.process, composed))
                augmented = [r.candidate for r in results if r.accepted]
                pipeline.write_tasks(augmented, out / "augmented")
                summary["augmented"] = {
                    "composed": len(composed),
                    "accepted": len(augmented),
                    "rejected": [r.reason for r in results if not r.accepted],
                }

    evaluation = [json.loads(p.read_text()) for p in sorted(SUITE_DIR.glob("*.json"))]
    generated = [json.loads(p.read_text()) for p in sorted((written / "tasks").glob("*.json"))]
    table = audit.overlap_audit(generated, evaluation, default_embedder().encode, config.audit.threshold)
    (out / "audit.json").write_text(json.dumps(table, indent=1) + "\n")
    (out / "report.json").write_text(json.dumps(summary, indent=1) + "\n")
    if "synthesis" in summary:
        print(json.dumps(summary["synthesis"], indent=1))
    if "from_run" in summary:
        fr = summary["from_run"]
        print(
            f"from run: {fr['episodes']} episodes over {fr['tasks']} tasks ({fr['failed_tasks']} failed, "
            f"{fr['solved_tasks']} solved); {fr['accepted']}/{fr['subtasks'] + fr['composed']} accepted "
            f"({fr['subtasks']} sub-tasks, {fr['composed']} composed)"
        )
    if "from_scratch" in summary:
        fs = summary["from_scratch"]
        print(
            f"from scratch: {fs['passed']}/{fs['tasks']} written tasks score 0 untouched and 1 solved "
            f"({fs['distinct_instructions']} distinct instructions)"
        )
    if "augmented" in summary:
        print(
            f"augmented: {summary['augmented']['accepted']}/{summary['augmented']['composed']} composed tasks accepted"
        )
    print(audit.format_audit("verigen", table))
    print(f"wrote {len(generated)} tasks to {written / 'tasks'}")


if __name__ == "__main__":
    app.run(main)
