"""The scripted MiniWoB++ oracle's success rate per task and action space, on real capsules.

For every task of `miniwob_oracle.ORACLE_TASKS` (or --tasks) and every action space of
--action_spaces, the oracle plays --seeds episodes (seeds 0..N-1) through a
`CapsuleRuntime` (one shared Chromium), --concurrency episodes at a time, each on its own
environment id that is reset to the next (task, seed). An episode counts as a success when
MiniWoB pays a positive raw reward within --max_steps oracle actions (the oracle reads
each page as the demonstrator does, its DOM parsed back from the DOM text); an OracleError, a
time limit or a wrong click is a failure. Prints one row per task: success rate per action
space, and the mean / max number of actions of the successful episodes.

  python -m experiments.benchmarks.oracle_coverage [--seeds 100] [--tasks click-test enter-text]
      [--action_spaces coordinates elements] [--concurrency 4]

Element actions need a runtime that resolves element ids (`CapsuleRuntime(action_space=...)`);
where the installed runtime has no such parameter, that action space is reported as
unavailable instead of measured.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import inspect
import json
import os
import time

from cua_jax.envs import actions as A
from cua_jax.envs.capsules import CapsuleRuntime
from cua_jax.envs.miniwob import MiniWoBObservation, dom_from_text, dom_to_text
from cua_jax.envs.miniwob_oracle import ORACLE_TASKS, OracleError, oracle_action

DEFAULT_MAX_STEPS = 20


@dataclasses.dataclass(frozen=True)
class Episode:
    task: str
    seed: int
    action_space: str
    success: bool
    steps: int
    reason: str  # MiniWoB's reason, the oracle's error, or "step limit"


def runtime_supports(action_space: str) -> bool:
    """Whether this CapsuleRuntime can carry out `action_space`'s actions (element ids need support)."""
    return action_space == "coordinates" or "action_space" in inspect.signature(CapsuleRuntime).parameters


def make_runtime(action_space: str, **kwargs) -> CapsuleRuntime:
    if action_space != "coordinates":
        kwargs["action_space"] = action_space
    return CapsuleRuntime(include_dom_text=True, **kwargs)


def as_demonstrated(observation: MiniWoBObservation, action_space: str = "coordinates") -> MiniWoBObservation:
    """The observation as the demonstrator reads it back from a prompt: the DOM parsed from its
    text (`dom_from_text`: positions in whole pixels, as printed; none at all for "elements",
    whose DOM text leaves geometry out)."""
    if action_space == "elements":
        return dataclasses.replace(observation, dom=dom_from_text(dom_to_text(observation.dom, geometry=False)))
    if observation.dom_text is None:
        return observation
    return dataclasses.replace(observation, dom=dom_from_text(observation.dom_text))


async def oracle_episode(
    runtime: CapsuleRuntime, env_id: str, task: str, seed: int, action_space: str, max_steps: int = DEFAULT_MAX_STEPS
) -> Episode:
    """One episode of `task` / `seed` on `env_id` (reset here), the oracle choosing every action."""
    observation = await runtime.areset(env_id, seed=seed, task=task)
    for step in range(1, max_steps + 1):
        try:
            action = oracle_action(as_demonstrated(observation, action_space), action_space)
        except OracleError as error:
            return Episode(task, seed, action_space, False, step - 1, f"oracle: {error}")
        # Through the text form, as a policy's action would come.
        result = await runtime.astep(env_id, A.parse_action(A.render_action(action), action_space))
        if result.invalid_action is not None:
            return Episode(task, seed, action_space, False, step, f"invalid: {result.invalid_action}")
        if result.done:
            return Episode(task, seed, action_space, result.success, step, str(result.reason))
        observation = result.observation
    return Episode(task, seed, action_space, False, max_steps, "step limit")


async def run_episodes(
    runtime: CapsuleRuntime,
    jobs: list[tuple[str, int]],
    action_space: str,
    concurrency: int,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> list[Episode]:
    """Every (task, seed) of `jobs`, `concurrency` environments at a time (each created once, then reset)."""
    queue = collections.deque(jobs)
    out: list[Episode] = []

    async def worker() -> None:
        env_id = None
        try:
            while queue:
                task, seed = queue.popleft()
                if env_id is None:
                    env_id = await runtime.acreate(task, seed=seed)
                out.append(await oracle_episode(runtime, env_id, task, seed, action_space, max_steps))
        finally:
            if env_id is not None:
                await runtime.aclose(env_id)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(jobs))))))
    return out


def summarize(episodes: list[Episode]) -> dict[str, dict[str, dict[str, float]]]:
    """{task: {action_space: {success, episodes, mean_steps, max_steps}}} (steps of successes)."""
    groups: dict[tuple[str, str], list[Episode]] = collections.defaultdict(list)
    for e in episodes:
        groups[(e.task, e.action_space)].append(e)
    table: dict[str, dict[str, dict[str, float]]] = collections.defaultdict(dict)
    for (task, space), group in groups.items():
        wins = [e.steps for e in group if e.success]
        table[task][space] = {
            "success": len(wins) / len(group),
            "episodes": len(group),
            "mean_steps": sum(wins) / len(wins) if wins else 0.0,
            "max_steps": max(wins, default=0),
        }
    return dict(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(ORACLE_TASKS))
    parser.add_argument("--seeds", type=int, default=100, help="seeds 0..N-1 per task and action space")
    parser.add_argument("--action_spaces", nargs="+", default=["coordinates", "elements"], choices=A.ACTION_SPACES)
    parser.add_argument("--concurrency", type=int, default=4, help="episodes at once (MiniWoB's limits are wall-clock)")
    parser.add_argument("--max_steps", type=int, default=DEFAULT_MAX_STEPS)
    parser.add_argument(
        "--time_limit_s",
        type=float,
        default=None,
        help="episode time limit for every task (default: MiniWoB's own, 10 s for most tasks); "
        "a generous one keeps a busy machine's slowness out of the oracle's rate",
    )
    parser.add_argument("--failures", type=int, default=3, help="failed episodes to print per task and action space")
    parser.add_argument("--out", default="", help="write the episodes and the table as JSON here")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.tasks) - set(ORACLE_TASKS))
    if unknown:
        parser.error(f"the oracle has no script for {unknown}")

    started = time.perf_counter()
    episodes: list[Episode] = []
    unavailable = []
    for space in args.action_spaces:
        if not runtime_supports(space):
            unavailable.append(space)
            print(f"{space}: this CapsuleRuntime cannot carry out element actions; not measured", flush=True)
            continue
        runtime = make_runtime(space, call_timeout_s=3600, time_limit_s=args.time_limit_s)
        try:
            for task in args.tasks:
                t0 = time.perf_counter()
                done = runtime.run_async(
                    run_episodes(
                        runtime, [(task, s) for s in range(args.seeds)], space, args.concurrency, args.max_steps
                    )
                )
                episodes.extend(done)
                cell = summarize(done)[task][space]
                late = sum(e.reason == "timed out" for e in done)
                print(
                    f"{space:<12} {task:<28} {cell['success']:6.1%}  steps {cell['mean_steps']:.1f}/{cell['max_steps']}"
                    f"  ({time.perf_counter() - t0:.0f} s; {late} timed out)",
                    flush=True,
                )
                for e in [e for e in done if not e.success][: args.failures]:
                    print(f"    seed {e.seed}: {e.steps} steps, {e.reason[:160]}", flush=True)
        finally:
            runtime.shutdown()

    table = summarize(episodes)
    spaces = [s for s in args.action_spaces if s not in unavailable]
    header = f"{'task':<28}" + "".join(f"{s:>13}{'steps':>10}" for s in spaces)
    print("\n" + header + "\n" + "-" * len(header))
    for task in args.tasks:
        row = f"{task:<28}"
        for s in spaces:
            cell = table.get(task, {}).get(s)
            row += (
                f"{cell['success']:>13.0%}{cell['mean_steps']:>6.1f}/{cell['max_steps']:<3d}" if cell else f"{'-':>23}"
            )
        print(row)
    for s in spaces:
        solved = [t for t in args.tasks if table.get(t, {}).get(s, {}).get("success", 0) >= 0.95]
        print(f"{s}: {len(solved)}/{len(args.tasks)} tasks at >= 95%")
    print(f"total wall time {time.perf_counter() - started:.0f} s")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(
                {
                    "args": vars(args),
                    "table": table,
                    "unavailable": unavailable,
                    "episodes": [dataclasses.asdict(e) for e in episodes],
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
