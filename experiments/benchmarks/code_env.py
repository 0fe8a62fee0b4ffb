"""Code environment benchmark: a fresh container per episode against a pooled container reset to
a clean tree, side by side in one process on the same tasks.

Each episode is the oracle's (reset, one str_replace, submit: the judge runs the package's
tests), so both modes do the same work and every episode must succeed. Printed per mode:

  episodes/s      whole episodes per second, `--episodes` in a row on one environment
  reset s         seconds per reset (fresh: start a container + copy the tree; pooled: kill
                  every process, empty the tmpfs, copy the tree)
  judge s         seconds from submit to the verdict (the package's whole test suite)

and the ratio pooled / fresh of episodes per second and of reset time.

  python -m experiments.benchmarks.code_env [--episodes 6] [--package inflection]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import time

from cua_jax.envs.code_env import CodeEnvConfig, CodeEnvironment
from cua_jax.envs.images import ensure_image
from cua_jax.tasks.code_suite import oracle_actions
from cua_jax.tasks.code_tasks import load_code_suite

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
    return {"episodes_per_s": len(tasks) / elapsed, "reset_s": statistics.median(resets),
            "judge_s": statistics.median(judges)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--package", default="inflection")
    args = parser.parse_args()
    tasks = [t for t in load_code_suite(SUITE) if t.package == args.package][:args.episodes]
    if not tasks:
        raise SystemExit(f"no task of package {args.package!r} in {SUITE}")
    image = ensure_image("code")
    results = {}
    for mode in ("fresh", "pooled"):
        results[mode] = asyncio.run(_episodes(mode, image, tasks))
    print(f"{len(tasks)} oracle episodes of {args.package}, one environment, sequential")
    print(f"{'mode':8s} {'episodes/s':>11s} {'reset s':>9s} {'judge s':>9s}")
    for mode, r in results.items():
        print(f"{mode:8s} {r['episodes_per_s']:11.3f} {r['reset_s']:9.3f} {r['judge_s']:9.3f}")
    fresh, pooled = results["fresh"], results["pooled"]
    print(f"pooled / fresh: episodes/s x{pooled['episodes_per_s'] / fresh['episodes_per_s']:.2f}, "
          f"reset time x{pooled['reset_s'] / fresh['reset_s']:.2f}")


if __name__ == "__main__":
    main()
