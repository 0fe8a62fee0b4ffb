"""Playing a task's scripted steps (`scripts.solution`, `scripts.near_miss`) as an agent would:
each step becomes one action of the grammar, by element id.

Steps (a task's README lists them):
    {"click": "<css>"}              click_element on the first element the selector matches
                                    (an <option>: chosen in its <select>)
    {"fill": "<css>", "text": "."} fill_element
    {"key": "Enter"}                key
    {"answer": "..."}               answer (ends the episode)
    {"done": true}                  done (ends the episode)

A selector is resolved to the element's id on the page as it is when the step is played (the
page is observed first, so every rendered element has its id); a selector that matches no
element raises ScriptError naming the step. Nothing else reaches the page: no URL is opened,
no script runs but the look-up.

    python -m cua_jax.envs.webapp.script --suite cua_jax/tasks/suites/webapp/trac --write

plays every task's solution, near-miss and nothing (an episode ended at once) and prints each
score; a task whose solution does not score 1, or whose near-miss or nothing does not score 0,
is listed as failing (exit status 1). --write records the scores and each solution's actions
in the suite's validation.json (committed: the oracle policy of `experiments.evaluate` replays
those actions).
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.envs.webapp.tasks import VALIDATION_FILE

_REF_JS = """(selector) => {
  const el = document.querySelector(selector);
  return el === null || el.dataset.cua_ref === undefined ? null : Number(el.dataset.cua_ref);
}"""


class ScriptError(ValueError):
    """A step that cannot be played: malformed, or a selector the page does not match."""


def step_action(step: Mapping[str, Any], ref_of) -> A.Action:
    """The action of one step; `ref_of(selector)` gives an element's id (None: no match)."""

    def ref(selector: str) -> int:
        found = ref_of(selector)
        if found is None:
            raise ScriptError(f"step {dict(step)}: no element on the page matches {selector!r}")
        return int(found)

    if "click" in step:
        return A.ClickElement(ref(step["click"]))
    if "fill" in step:
        return A.FillElement(ref(step["fill"]), str(step.get("text", "")))
    if "key" in step:
        keys = tuple(A.canonical_key(k) or k.lower() for k in str(step["key"]).split("+"))
        return A.Key(keys)
    if "answer" in step:
        return A.Answer(str(step["answer"]))
    if step.get("done"):
        return A.Done()
    raise ScriptError(f"unknown step {dict(step)}: a step is one of click, fill, key, answer, done")


def play(runtime: Any, env_id: str, steps: Sequence[Mapping[str, Any]], played: list | None = None) -> Any:
    """Play `steps` in capsule `env_id` of a WebappRuntime; the last StepResult (the episode's
    end when the steps end it). The actions are appended to `played` when given. An invalid
    action raises ScriptError naming the step."""
    result = None
    runtime.observe(env_id)  # the first observation gives the page's elements their ids, as a reset's does
    for step in steps:
        action = step_action(step, lambda selector: runtime.evaluate(env_id, _REF_JS, selector))
        result = runtime.step(env_id, action)
        if played is not None:
            played.append(action)
        if result.invalid_action:
            raise ScriptError(f"step {dict(step)} was refused: {result.invalid_action}")
        if result.done:
            break
    return result


def validate(runtime: Any, tasks: Sequence[Any]) -> tuple[dict[str, dict[str, float]], dict[str, list[str]]]:
    """Every task's solution, near-miss and nothing, each in a fresh capsule: ({task: {play:
    score}}, {task: the solution's actions as the policy's replies}). The seeded state is
    deterministic and a page numbers its elements in document order, so a solution's actions
    are the same in every capsule: the oracle policy replays them (`demonstrations`)."""
    scores: dict[str, dict[str, float]] = {}
    demonstrations: dict[str, list[str]] = {}
    for task in tasks:
        scores[task.task_id] = {}
        plays = {name: task.scripts.get(name, ()) for name in ("solution", "near_miss")}
        plays["nothing"] = ({"done": True},)
        for name, steps in plays.items():
            env_id = runtime.create(task)
            played: list[A.Action] = []
            try:
                result = play(runtime, env_id, steps, played)
                scores[task.task_id][name] = float(result.reward) if result is not None and result.done else 0.0
            except ScriptError as error:
                scores[task.task_id][name] = float("nan")
                print(f"{task.task_id} {name}: {error}", file=sys.stderr)
            finally:
                runtime.close(env_id)
            if name == "solution" and scores[task.task_id][name] == 1.0:
                demonstrations[task.task_id] = [A.render_action(action) for action in played]
        print(f"{task.task_id}: {scores[task.task_id]}", file=sys.stderr, flush=True)  # progress
    return scores, demonstrations


def demonstrations(folder: str | pathlib.Path) -> dict[str, tuple[str, ...]]:
    """The recorded solutions of a task folder's validation file ({} when it has none); read
    once per version of the file (a policy asks for each of a suite's tasks)."""
    path = pathlib.Path(folder).resolve() / VALIDATION_FILE
    if not path.is_file():
        return {}
    stat = path.stat()
    return dict(_read_demonstrations(path, stat.st_mtime_ns, stat.st_size))  # the cached one stays as read


@functools.lru_cache(maxsize=16)
def _read_demonstrations(path: pathlib.Path, mtime_ns: int, size: int) -> dict[str, tuple[str, ...]]:
    return {task: tuple(replies) for task, replies in json.loads(path.read_text())["demonstrations"].items()}


def failing(scores: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Tasks whose solution does not score 1 or whose near-miss or nothing does not score 0."""
    expected = {"solution": 1.0, "near_miss": 0.0, "nothing": 0.0}
    return [task for task, got in scores.items() if any(got.get(p) != want for p, want in expected.items())]


def main(argv: Sequence[str] | None = None) -> int:
    from cua_jax.envs.webapp.runtime import WebappRuntime
    from cua_jax.envs.webapp.state import ensure_base_state
    from cua_jax.envs.webapp.tasks import load_tasks

    parser = argparse.ArgumentParser(description="Play every task's solution, near-miss and nothing.")
    parser.add_argument("--suite", default=str(pathlib.Path(__file__).parents[2] / "tasks/suites/webapp/trac"))
    parser.add_argument("--scale", default="test")
    parser.add_argument("--tasks", default="", help="comma-separated task ids (default: all)")
    parser.add_argument("--out", default="", help="write the scores and solutions as JSON here")
    parser.add_argument("--write", action="store_true", help=f"write them to the suite's {VALIDATION_FILE}")
    args = parser.parse_args(argv)
    tasks = load_tasks(args.suite)
    if args.tasks:
        wanted = set(args.tasks.split(","))
        tasks = [t for t in tasks if t.task_id in wanted]
    with tempfile.TemporaryDirectory(prefix="cua-webapp-validate-") as workdir:
        with WebappRuntime(ensure_base_state(args.scale), workdir, action_space="elements") as runtime:
            scores, solutions = validate(runtime, tasks)
    bad = failing(scores)
    for task, got in scores.items():
        print(f"{task}: " + ", ".join(f"{p}={s:g}" for p, s in got.items()) + ("  FAILS" if task in bad else ""))
    print(f"{len(scores) - len(bad)} of {len(scores)} tasks: solution 1, near-miss 0, nothing 0")
    if args.write or args.out:
        out = pathlib.Path(args.out) if args.out else pathlib.Path(args.suite) / VALIDATION_FILE
        record = {"scale": args.scale, "scores": scores, "demonstrations": solutions}
        out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
