"""Code environment benchmark: a fresh container per episode against a pooled container reset to
a clean tree, side by side in one process on the same tasks.

Each episode is the oracle's (reset, one str_replace, submit: the judge runs the package's
tests), so both modes do the same work and every episode must succeed. Printed per mode:

  episodes/s      whole episodes per second, `--episodes` in a row on one environment
  reset s         seconds per reset (fresh: start a container + copy the tree; pooled: kill
                  every process, empty the tmpfs, copy the tree)
  judge s         seconds from submit to the verdict (the package's whole test suite)

and the ratio pooled / fresh of episodes per second and of reset time.

With --judge, the judge's own cost instead: oracle episodes on one pooled environment, the
judge of each (submit) alternating between the pristine-copy judge episodes use and the former
judge that ran pytest in the agent's work tree (the runner's `"isolated": false`, a baseline
nothing else asks for), `--episodes` of each. Printed per judge: the median seconds from the
judge request to its answer, and of pytest's run inside it; then the ratio and the time the
pristine copy adds, as a share of the former judge's time.

  python -m experiments.benchmarks.code_env [--episodes 6] [--package inflection]
  python -m experiments.benchmarks.code_env --judge [--episodes 20] [--package inflection]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import time

from cua_jax.environments.code_env import CodeEnvConfig, CodeEnvironment
from cua_jax.envs.images import ensure_image
from cua_jax.tasks.code_suite import oracle_actions
from cua_jax.tasks.code_tasks import judge_request, load_code_suite, verdict

SUITE = pathlib.Path(__file__).resolve().parents[2] / "cua_jax" / "tasks" / "suites" / "code"


async def _episodes(mode: str, image: str, tasks) -> dict[str, float]:
    env = CodeEnvironment(CodeEnvConfig(image=image, reset_mode=mode))
    resets, judges = [], []
    try:
        await env.reset(tasks[0])  # the pooled container's start is not an episode's cost
        await env.end_episode()
        started = time.perf_counter()
        for task in tasks:
            t0 = time.perf_counter()
            await env.reset(task)
            resets.append(time.perf_counter() - t0)
            for action in oracle_actions(task):
                step = await env.step(action)
            if step.reward != 1.0:
                raise RuntimeError(f"{task.id}: the oracle failed in {mode} mode: {step.outcome}")
            judges.append(env.episode.judge_seconds)
            await env.end_episode()
        elapsed = time.perf_counter() - started
    finally:
        await env.close()
    return {
        "episodes_per_s": len(tasks) / elapsed,
        "reset_s": statistics.median(resets),
        "judge_s": statistics.median(judges),
    }


JUDGES = {"work tree (former)": False, "pristine copy": True}  # name -> the request's `isolated`


async def _judge_times(image: str, tasks, episodes: int) -> dict[str, dict[str, list[float]]]:
    """Seconds of each judge (the whole request, and pytest inside it) over `episodes` oracle
    episodes each: both judges on each task in turn, which of them goes first alternating."""
    env = CodeEnvironment(CodeEnvConfig(image=image))
    times = {name: {"judge_s": [], "pytest_s": []} for name in JUDGES}
    try:
        for i in range(2 * episodes):
            name = list(JUDGES)[(i + i // 2) % 2]
            task = tasks[(i // 2) % len(tasks)]
            await env.reset(task)
            for action in oracle_actions(task)[:-1]:  # the fix; the judge is called here instead of submit
                await env.step(action)
            t0 = time.perf_counter()
            answer = await asyncio.to_thread(
                env.container.call,
                judge_request(task.package, task.bug, task.test_files, task.timeout, isolated=JUDGES[name]),
            )
            elapsed = time.perf_counter() - t0
            if not answer["ok"] or verdict(task, answer["outcomes"]).reward != 1.0:
                raise RuntimeError(f"{task.id}: the oracle failed under the {name} judge: {answer.get('error')}")
            times[name]["judge_s"].append(elapsed)
            times[name]["pytest_s"].append(answer["seconds"])
            await env.end_episode()
    finally:
        await env.close()
    return times


def judge_main(image: str, tasks, episodes: int, package: str) -> None:
    times = asyncio.run(_judge_times(image, tasks, episodes))
    print(
        f"{episodes} oracle episodes per judge of {package} ({len(tasks)} tasks), alternating, one pooled environment"
    )
    print(f"{'judge':20s} {'judge s':>9s} {'pytest s':>9s}   (medians)")
    medians = {}
    for name, t in times.items():
        medians[name] = statistics.median(t["judge_s"])
        print(f"{name:20s} {medians[name]:9.3f} {statistics.median(t['pytest_s']):9.3f}")
    former, pristine = medians["work tree (former)"], medians["pristine copy"]
    print(
        f"pristine / former: x{pristine / former:.3f}; added {pristine - former:+.3f} s "
        f"({100 * (pristine - former) / former:+.1f}% of the former judge's time)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=None, help="default: 6, with --judge 20 per judge")
    parser.add_argument("--package", default="inflection")
    parser.add_argument("--judge", action="store_true", help="the judge's time, pristine copy vs the former")
    args = parser.parse_args()
    episodes = args.episodes or (20 if args.judge else 6)
    tasks = [t for t in load_code_suite(SUITE) if t.package == args.package][:episodes]
    if not tasks:
        raise SystemExit(f"no task of package {args.package!r} in {SUITE}")
    image = ensure_image("code")
    if args.judge:
        judge_main(image, tasks, episodes, args.package)
        return
    results = {}
    for mode in ("fresh", "pooled"):
        results[mode] = asyncio.run(_episodes(mode, image, tasks))
    print(f"{len(tasks)} oracle episodes of {args.package}, one environment, sequential")
    print(f"{'mode':8s} {'episodes/s':>11s} {'reset s':>9s} {'judge s':>9s}")
    for mode, r in results.items():
        print(f"{mode:8s} {r['episodes_per_s']:11.3f} {r['reset_s']:9.3f} {r['judge_s']:9.3f}")
    fresh, pooled = results["fresh"], results["pooled"]
    print(
        f"pooled / fresh: episodes/s x{pooled['episodes_per_s'] / fresh['episodes_per_s']:.2f}, "
        f"reset time x{pooled['reset_s'] / fresh['reset_s']:.2f}"
    )


if __name__ == "__main__":
    main()
