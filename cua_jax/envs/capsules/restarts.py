"""Which MiniWoB tasks begin an episode in a used page exactly as on a new page.

A capsule runtime with `episodes_per_page` above 1 begins the next episode of a task in the
page the last one ran in (seeded, `core.startEpisodeReal`, as MiniWoB++'s own environment
does). Most tasks rebuild everything they show from the seed; some keep state across
episodes in their own script (jQuery widgets initialised once, a text area's edited value,
an animation's phase), so a used page shows them differently from a new one. The runtime
restarts in page only the tasks listed in `restart_exact_tasks.txt` (read by
`runtime.restart_exact_tasks`), which
`python -m cua_jax.envs.capsules.restarts --write` measures: for every task, each seed pair
(a, b) below, an episode of seed a with a click and typing in it, then seed b begun in the
same page, then seed b again, against seed b on a new page: the utterance, the DOM text and
every pixel (with the element ids drawn: the `both` action space) must match. The file
records the Chromium and miniwob versions it was measured with.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from cua_jax.envs import actions as A
from cua_jax.envs.capsules.options import CapsuleOptions
from cua_jax.envs.capsules.runtime import EXACT_TASKS_FILE
from cua_jax.envs.miniwob import task_names

SEED_PAIRS = ((3, 7), (11, 5))


def restart_differences(runtime: Any, task: str, seed_pairs=SEED_PAIRS) -> list[str]:
    """What differs from seed b on a new page, for each (a, b), when seed b begins in a page
    used by seed a and then again after itself: e.g. ["dom (3 -> 7)", "pixels (7 -> 7)"]; []
    when nothing does. `runtime` is a CapsuleRuntime with episodes_per_page of 3 or more,
    `task` among its restart_tasks, and include_dom_text=True."""
    if runtime.episodes_per_page < 3:
        raise ValueError("restart_differences needs a runtime with episodes_per_page of 3 or more")
    differences = []
    for used_seed, seed in seed_pairs:
        fresh = runtime.create(task, seed=seed)
        used = runtime.create(task, seed=used_seed)
        try:
            want = runtime.observe(fresh)
            restarts = runtime.page_restarts
            if not runtime.step(used, A.Click("left_click", 500, 600)).done:
                runtime.step(used, A.Type("abc"))
            for again in range(2):  # seed b after seed a, then after itself
                got = runtime.reset(used, seed=seed)
                pair = f"({seed if again else used_seed} -> {seed})"
                if runtime.page_restarts != restarts + again + 1:  # e.g. the click navigated the page away
                    differences.append(f"not restarted in page {pair}")
                    break
                found = []
                if got.utterance != want.utterance:
                    found.append(f"utterance {pair}")
                if got.dom_text != want.dom_text:
                    found.append(f"dom {pair}")
                if got.screenshot.shape != want.screenshot.shape or not np.array_equal(got.screenshot, want.screenshot):
                    found.append(f"pixels {pair}")
                differences.extend(f for f in found if f not in differences)
        finally:
            runtime.close(fresh)
            runtime.close(used)
    return differences


def _versions(runtime: Any) -> str:
    import importlib.metadata
    import re

    env = runtime.create("click-button", seed=0)
    try:
        agent = runtime.evaluate(env, "navigator.userAgent")
    finally:
        runtime.close(env)
    chromium = re.search(r"Chrome/([\d.]+)", agent)
    return f"miniwob {importlib.metadata.version('miniwob')}, Chromium {chromium.group(1) if chromium else agent}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {EXACT_TASKS_FILE.name}")
    parser.add_argument("tasks", nargs="*", help="tasks to check (default: all)")
    args = parser.parse_args(argv)
    tasks = args.tasks or list(task_names())
    runtime = CapsuleOptions(warm_pages=0, episodes_per_page=3).runtime(
        include_dom_text=True, action_space="both", time_limit_s=600, restart_tasks=frozenset(tasks)
    )
    exact, differing = [], {}
    try:
        for i, task in enumerate(tasks, 1):
            found = restart_differences(runtime, task)
            if found:
                differing[task] = found
            else:
                exact.append(task)
            print(f"[{i}/{len(tasks)}] {task}: {', '.join(found) or 'exact'}", flush=True)
        versions = _versions(runtime)
    finally:
        runtime.shutdown()
    print(f"{len(exact)} of {len(tasks)} tasks restart exactly")
    if args.write:
        header = [
            "# MiniWoB tasks whose episodes begin in a used page exactly as on a new page,",
            f"# measured by `python -m cua_jax.envs.capsules.restarts --write` ({versions}).",
            "# Not listed, with what differed:",
            *(f"#   {task}: {', '.join(found)}" for task, found in sorted(differing.items())),
        ]
        EXACT_TASKS_FILE.write_text("\n".join(header + sorted(exact)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
