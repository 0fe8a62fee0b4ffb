"""Role ablation of the VeriGen loop in the spirit of ScaleCUA Table 4.

The same stream of template candidates — half of them carrying a proposer defect
(templates.DEFECTS: unstated values, non-deterministic judges, judges that write, wrong
paths, unbounded loops) — goes through the full loop and through the loop with the
judger, the fixer or the rule validator removed. Every accepted task is then audited
from scratch on a fresh environment: its judge must score the untouched state 0 and the
solved state 1 three times each, leave the environment unchanged, and its instruction
must state every value the judge requires. Executable rate = audited / accepted.

    python -m experiments.benchmarks.verigen_roles [--candidates 24] [--pool 4] [--all-families]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import time

from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
from cua_jax.envs.images import ensure_image
from cua_jax.tasks import judges
from cua_jax.tasks.schema import parse_task
from cua_jax.tasks.verigen import pipeline, templates
from cua_jax.tasks.verigen.candidate import Candidate
from cua_jax.tasks.verigen.probe import InteractionProbe
from cua_jax.tasks.verigen.roles import ProgrammaticJudger, ScriptedChecker, TemplateFixer

FAST_FAMILIES = ("file_create", "file_append", "file_replace", "term_rename", "term_tree")
CONFIGS = {
    "full": pipeline.LoopConfig(),
    "- judger": pipeline.LoopConfig(use_judger=False),
    "- fixer": pipeline.LoopConfig(use_fixer=False),
    "- rule validator": pipeline.LoopConfig(use_rules=False),
}
LISTING = (
    "import os\nfor top in ('/root', '/tmp'):\n    for d, _, fs in os.walk(top):\n        for f in fs:\n"
    "            p = os.path.join(d, f)\n            print(p, os.path.getsize(p), os.path.getmtime(p))\n"
)


def audit(probe: InteractionProbe, candidate: Candidate, repeats: int = 3, cap: float = 5.0) -> tuple[bool, str]:
    """(valid, why not) of an accepted task, from scratch on a fresh environment."""
    missing = [v for v in candidate.metadata.get("stated", []) if str(v) not in candidate.instruction]
    if missing:
        return False, f"instruction does not state {missing[0]!r}"
    task = parse_task(candidate.task)
    task = dataclasses.replace(
        task, evaluator=dataclasses.replace(task.evaluator, timeout=min(cap, task.evaluator.timeout))
    )
    with probe.session() as session:
        try:
            session.setup(task, candidate.setup_actions)
            initial = [session.judge(task) for _ in range(repeats)]
            for text in candidate.solution:
                if not session.act(text).ok:
                    return False, "the reference solution was rejected"
            before = session.run_python(LISTING)["output"]
            final = [session.judge(task) for _ in range(repeats)]
            after = session.run_python(LISTING)["output"]
        except (judges.JudgeError, judges.SetupError) as error:
            return False, f"judge/setup error: {error}"
    if set(initial) != {0.0}:
        return False, f"initial-state scores {initial}"
    if set(final) != {1.0}:
        return False, f"solved-state scores {final}"
    if before != after:
        return False, "the judge changed the environment"
    return True, ""


def run_config(probe, name, loop, candidates_n, seed, families, workers, cap):
    proposer = templates.TemplateProposer(seed=seed, families=families, defect_rate=0.5)
    checker = ScriptedChecker(probe, judge_timeout_cap=cap)
    verigen = pipeline.VeriGen(proposer, ProgrammaticJudger(), checker, TemplateFixer(), loop)
    started = time.monotonic()
    report = verigen.run(target=10**9, max_candidates=candidates_n, workers=workers)
    accepted = report.accepted
    with concurrent.futures.ThreadPoolExecutor(workers) as executor:
        verdicts = list(executor.map(lambda c: audit(probe, c, cap=cap), accepted))
    valid = sum(ok for ok, _ in verdicts)
    why = sorted({w for ok, w in verdicts if not ok})
    return {
        "config": name,
        "candidates": len(report.results),
        "accepted": len(accepted),
        "valid": valid,
        "executable_rate": valid / len(accepted) if accepted else 0.0,
        "yield": valid / len(report.results) if report.results else 0.0,
        "seconds": time.monotonic() - started,
        "invalid_because": why,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=24)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--all-families", action="store_true")
    parser.add_argument("--judge-timeout-cap", type=float, default=3.0)
    args = parser.parse_args()
    families = None if args.all_families else FAST_FAMILIES
    rows = []
    with (
        DockerEnvPool(PoolConfig(image=ensure_image("desktop"), size=args.pool, health_interval=None)) as pool,
        InteractionProbe(pool) as probe,
    ):
        for name, loop in CONFIGS.items():
            rows.append(
                run_config(
                    probe, name, loop, args.candidates, args.seed, families, args.workers, args.judge_timeout_cap
                )
            )
            print(f"[{name}] done in {rows[-1]['seconds']:.0f}s", flush=True)
    full = rows[0]
    print(
        f"\nVeriGen role ablation: {args.candidates} candidates per configuration, defect rate 0.5, "
        f"families: {'all' if families is None else ', '.join(families)}"
    )
    print(
        f"{'configuration':18s} {'accepted':>8s} {'valid':>6s} {'executable rate':>16s} {'delta':>8s} "
        f"{'ratio':>6s} {'yield':>6s}"
    )
    for row in rows:
        delta = 100 * (row["executable_rate"] - full["executable_rate"])
        ratio = row["executable_rate"] / full["executable_rate"] if full["executable_rate"] else float("nan")
        print(
            f"{row['config']:18s} {row['accepted']:8d} {row['valid']:6d} {100 * row['executable_rate']:15.1f}% "
            f"{delta:+7.1f}% {ratio:6.2f} {100 * row['yield']:5.1f}%"
        )
    for row in rows:
        if row["invalid_because"]:
            print(f"  {row['config']}: invalid because {row['invalid_because']}")


if __name__ == "__main__":
    main()
