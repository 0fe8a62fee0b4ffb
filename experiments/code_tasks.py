"""The code suite: python -m experiments.code_tasks generate | validate

    generate [--out DIR] [--per-package 20] [--candidates 100] [--seed 0] [--workers 2] [--packages a,b]
        For each package of cua_jax.tasks.code_packages (sdists pinned in
        launch/images/code/pip-sdists.txt, in the `code` image): run its tests on the clean
        tree, draw AST mutations (cua_jax.tasks.bug_injection, round-robin over the kinds),
        run the tests on each mutant and keep it when some clean-passing tests now fail and
        every other test keeps its outcome (cua_jax.tasks.code_suite.fail_to_pass). Each kept
        mutant becomes DIR/<id>.json (the issue report, the bug as a hunk, the oracle fix) and
        DIR/patches/<id>.diff (the fix as a unified diff).
    validate [--suite DIR] [--workers 2] [--random-seeds 1]
        Plays the oracle, a no-op agent (submits at once) and a random policy
        (code_suite.RandomPolicy) on every task through the code environment; prints the
        success rates and writes DIR/validation.json. The oracle must solve 100%, the no-op 0%;
        random episodes that a resource limit quarantined (a random edit can make the tests
        exhaust the container's memory) are counted apart, not as failures.

Every container runs with no network; the image is built when missing.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import pathlib
import sys
import time

from cua_jax.environments.code_env import CodeContainer, CodeEnvConfig, CodeEnvironment, ContainerFault
from cua_jax.envs.images import ensure_image
from cua_jax.tasks import code_suite as S
from cua_jax.tasks.bug_injection import sample_mutations
from cua_jax.tasks.code_packages import PACKAGES
from cua_jax.tasks.code_tasks import load_code_suite

SUITE = pathlib.Path(__file__).resolve().parents[1] / "cua_jax" / "tasks" / "suites" / "code"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def generate_package(name: str, image: str, per_package: int, candidates: int, seed: int, out: pathlib.Path) -> int:
    package = PACKAGES[name]
    container = CodeContainer(CodeEnvConfig(), image).start()
    try:
        clean = S.clean_run(container, package)
        passing = sum(o == "passed" for o in clean.outcomes.values())
        _log(f"{name}: clean run {passing}/{len(clean.outcomes)} passed in {clean.seconds:.1f}s")
        found, sources = S.package_mutations(container, package)
        drawn = sample_mutations(found, candidates, seed)
        timeout = max(30.0, 5 * clean.seconds + 10)
        kept = tried = 0
        for mutation in drawn:
            if kept >= per_package:
                break
            tried += 1
            try:
                mutant = S.run_tests(container, package, [mutation.hunk], timeout)
            except ContainerFault as error:  # the mutant broke the container: skip it, start another
                _log(f"{name}: {mutation.path}:{mutation.line} {mutation.description}: {error}; new container")
                container.remove()
                container = CodeContainer(CodeEnvConfig(), image).start()
                continue
            failing = None if mutant is None else S.fail_to_pass(clean, mutant)
            if failing is None:
                continue
            task_id = f"code-{name}-{kept:03d}"
            buggy = mutation.apply(sources[mutation.path])
            task = S.task_json(task_id, package, mutation, failing, clean, mutant, buggy)
            (out / f"{task_id}.json").write_text(json.dumps(task, indent=1) + "\n")
            (out / "patches" / f"{task_id}.diff").write_text(S.fix_diff(task, buggy, sources[mutation.path]))
            kept += 1
        _log(f"{name}: kept {kept} of {tried} mutants tried ({len(found)} sites)")
        return kept
    finally:
        container.remove()


def generate(args: argparse.Namespace) -> int:
    out = pathlib.Path(args.out)
    (out / "patches").mkdir(parents=True, exist_ok=True)
    names = args.packages.split(",") if args.packages else list(PACKAGES)
    for name in names:
        if name not in PACKAGES:
            raise SystemExit(f"--packages: unknown package {name!r}; known: {sorted(PACKAGES)}")
        for old in list(out.glob(f"code-{name}-*.json")) + list((out / "patches").glob(f"code-{name}-*.diff")):
            old.unlink()
    image = ensure_image("code")
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        counts = dict(
            zip(
                names,
                pool.map(
                    lambda n: generate_package(n, image, args.per_package, args.candidates, args.seed, out), names
                ),
            )
        )
    print(
        json.dumps(
            {"tasks": sum(counts.values()), "per_package": counts, "seconds": round(time.monotonic() - started)},
            indent=1,
        )
    )
    return 0


async def play(env: CodeEnvironment, task, actions, may_fault: bool = False) -> float | None:
    """The reward of a scripted episode; None when it was quarantined and `may_fault` (a random
    edit may make the tests exhaust the container's memory), else a quarantine raises."""
    await env.reset(task)
    for action in actions:
        step = await env.step(action)
        if step.done:
            await env.end_episode()
            if step.fault is not None:
                if may_fault:
                    _log(f"{task.id}: quarantined: {step.fault.reason}")
                    return None
                raise RuntimeError(f"{task.id}: quarantined: {step.fault.reason}")
            return step.reward
    raise RuntimeError(f"{task.id}: the scripted episode did not end")


async def validate_tasks(tasks, image: str, workers: int, random_seeds: int) -> dict:
    queue: asyncio.Queue = asyncio.Queue()
    for task in tasks:
        queue.put_nowait(task)
    results: dict[str, dict] = {}
    sources_cache: dict[str, dict[str, str]] = {}

    async def worker() -> None:
        env = CodeEnvironment(CodeEnvConfig(image=image))
        try:
            while not queue.empty():
                task = queue.get_nowait()
                row = {
                    "oracle": await play(env, task, S.oracle_actions(task)),
                    "noop": await play(env, task, S.noop_actions(task)),
                }
                if task.package not in sources_cache:
                    package = PACKAGES[task.package]
                    sources_cache[task.package] = {
                        p: S.read_clean_file(env.container, package.name, p) for p in package.sources
                    }
                row["random"] = [
                    await play(
                        env, task, S.RandomPolicy(seed).actions(task, sources_cache[task.package]), may_fault=True
                    )
                    for seed in range(random_seeds)
                ]
                results[task.id] = row
                _log(f"{task.id}: {row}")
        finally:
            await env.close()

    await asyncio.gather(*(worker() for _ in range(workers)))
    return results


def validate(args: argparse.Namespace) -> int:
    suite = pathlib.Path(args.suite)
    tasks = load_code_suite(suite)
    image = ensure_image("code")
    started = time.monotonic()
    results = asyncio.run(validate_tasks(tasks, image, args.workers, args.random_seeds))
    n = len(tasks)
    oracle = sum(r["oracle"] for r in results.values()) / n
    noop = sum(r["noop"] for r in results.values()) / n
    random_rewards = [x for r in results.values() for x in r["random"] if x is not None]
    summary = {
        "tasks": n,
        "packages": len({t.package for t in tasks}),
        "oracle_success": oracle,
        "noop_success": noop,
        "random_success": sum(random_rewards) / max(1, len(random_rewards)),
        "random_episodes": len(random_rewards),
        "random_quarantined": sum(x is None for r in results.values() for x in r["random"]),
        "seconds": round(time.monotonic() - started),
    }
    (suite / "validation.json").write_text(
        json.dumps(
            {
                "summary": summary,
                "tasks": dict(
                    sorted(
                        (k, {"oracle": v["oracle"], "noop": v["noop"], "random": v["random"]})
                        for k, v in results.items()
                    )
                ),
            },
            indent=1,
        )
        + "\n"
    )
    print(json.dumps(summary, indent=1))
    return 0 if oracle == 1.0 and noop == 0.0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.code_tasks", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate")
    gen.add_argument("--out", default=str(SUITE))
    gen.add_argument("--per-package", type=int, default=20)
    gen.add_argument("--candidates", type=int, default=100)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--workers", type=int, default=2)
    gen.add_argument("--packages", default="", help="comma-separated (default: all); others' tasks are kept")
    val = sub.add_parser("validate")
    val.add_argument("--suite", default=str(SUITE))
    val.add_argument("--workers", type=int, default=2)
    val.add_argument("--random-seeds", type=int, default=1)
    args = parser.parse_args(argv)
    return generate(args) if args.command == "generate" else validate(args)


if __name__ == "__main__":
    sys.exit(main())
