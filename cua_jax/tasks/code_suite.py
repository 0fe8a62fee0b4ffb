"""Building and validating the code suite: clean runs, mutants kept by their fail-to-pass
tests, task files with an issue report and the oracle fix, and scripted policies (oracle,
no-op, random) played through the code environment.

    container = CodeContainer(CodeEnvConfig(), image).start()
    clean = clean_run(container, package)                  # per-test outcomes of the clean tree
    kept = try_mutation(container, package, mutation, clean, timeout)   # None, or fail-to-pass tests
    task = task_json(task_id, package, mutation, kept, clean, buggy_source)

Used by experiments/code_tasks.py (generation, validation, the random baseline), the warm
start's demonstrations (`oracle_actions`) and the tests.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import random
import tarfile
from typing import Any

from cua_jax.envs.code_actions import Bash, Edit, Submit
from cua_jax.tasks.bug_injection import Mutation, apply_hunks, mutations
from cua_jax.tasks.code_packages import PACKAGES, CodePackage
from cua_jax.tasks.code_tasks import SNAPSHOT, CodeTask, judge_request

MAX_FAIL_TO_PASS = 12  # a bug that breaks more is no longer a focused issue
SHOWN_FAILURES = 5


@dataclasses.dataclass(frozen=True)
class TestRun:
    outcomes: dict[str, str]
    messages: dict[str, str]
    seconds: float


def read_clean_file(container, package: str, path: str) -> str:
    """A file of the clean repository `package` in the image, read through `container`."""
    stream, _ = container.client.api.get_archive(container.id, f"/opt/repos/{package}/{path}")
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.getmembers()[0]
        return tar.extractfile(member).read().decode("utf-8")


def run_tests(container, package: CodePackage, hunks: list, timeout: float) -> TestRun | None:
    """Reset `container` to the package with `hunks` applied and run its tests; None when the
    tests did not run to a report (a hang past `timeout`, a crash of pytest)."""
    answer = container.call({"op": "reset", "package": package.name, "hunks": [h.to_json() for h in hunks]})
    if not answer["ok"]:
        raise RuntimeError(f"{package.name}: reset failed: {answer['error']}")
    answer = container.call(judge_request(package.name, hunks, package.test_files, timeout))
    if not answer["ok"]:
        return None
    return TestRun(answer["outcomes"], answer["messages"], answer["seconds"])


def clean_run(container, package: CodePackage, timeout: float = 300.0) -> TestRun:
    run = run_tests(container, package, [], timeout)
    if run is None:
        raise RuntimeError(f"{package.name}: the clean tests did not run")
    return run


def fail_to_pass(clean: TestRun, mutant: TestRun) -> list[str] | None:
    """The tests the mutant breaks, when it is a keeper: at least one and at most
    MAX_FAIL_TO_PASS tests that pass on clean code fail, every other test keeps its clean
    outcome, and no test disappears (a module that no longer imports). None otherwise."""
    if set(mutant.outcomes) != set(clean.outcomes):
        return None
    broken = sorted(t for t, o in clean.outcomes.items() if o == "passed" and mutant.outcomes[t] != "passed")
    if not 1 <= len(broken) <= MAX_FAIL_TO_PASS:
        return None
    if any(mutant.outcomes[t] != o for t, o in clean.outcomes.items() if o != "passed"):
        return None
    return broken


def package_mutations(container, package: CodePackage) -> tuple[list[Mutation], dict[str, str]]:
    """Every mutation of the package's source files, and the clean sources by path."""
    sources = {path: read_clean_file(container, package.name, path) for path in package.sources}
    found = [m for path, text in sources.items() for m in mutations(text, path)]
    return found, sources


def issue_report(package: CodePackage, failing: list[str], messages: dict[str, str]) -> str:
    """The instruction: the failing tests, with their assertion messages, as an issue report."""
    command = f"python -m pytest {' '.join(package.test_files)}"
    lines = [
        f"{package.name}: {len(failing)} test{'s' if len(failing) > 1 else ''} of the test suite fail",
        "",
        f"Running the repository's tests (`{command}`) reports these failures:",
        "",
    ]
    for test in failing[:SHOWN_FAILURES]:
        lines.append(f"FAILED {test}")
        message = " ".join(messages.get(test, "").split())
        if message:
            lines.append(f"    {message[:300]}")
    if len(failing) > SHOWN_FAILURES:
        lines.append(f"... and {len(failing) - SHOWN_FAILURES} more")
    lines += [
        "",
        "The tests describe the intended behaviour; the package's code is wrong. Find the cause and fix it "
        "in the source, without changing the tests.",
    ]
    return "\n".join(lines)


def oracle_edit(buggy: str, mutation: Mutation) -> dict[str, str]:
    """A str_replace that undoes `mutation` in the buggy file: the bug's new lines with as
    much surrounding context as makes them occur exactly once."""
    hunk = mutation.hunk
    lines = buggy.split("\n")
    first, last = hunk.start - 1, hunk.start - 1 + len(hunk.new)
    for context in range(0, 40):
        lo, hi = max(0, first - context), min(len(lines), last + context)
        old = "\n".join(lines[lo:hi])
        if hi - lo > 0 and buggy.count(old) == 1:
            new = "\n".join(lines[lo:first] + list(hunk.old) + lines[last:hi])
            return {"path": hunk.path, "old_str": old, "new_str": new}
    raise ValueError(f"{hunk.path}:{hunk.start}: no unique context for the fix within 40 lines")


def task_json(
    task_id: str,
    package: CodePackage,
    mutation: Mutation,
    failing: list[str],
    clean: TestRun,
    mutant: TestRun,
    buggy_source: str,
) -> dict[str, Any]:
    clean_failures = sorted(t for t, o in clean.outcomes.items() if o in ("failed", "error"))
    return {
        "id": task_id,
        "snapshot": SNAPSHOT,
        "instruction": issue_report(package, failing, mutant.messages),
        "source": f"bug injection into {package.name} {package.version} ({mutation.kind})",
        "config": [
            {"type": "code_repository", "parameters": {"package": package.name, "bug": [mutation.hunk.to_json()]}}
        ],
        "related_apps": ["terminal", "python"],
        "evaluator": {
            "func": "pytest",
            "options": {
                "test_files": list(package.test_files),
                "fail_to_pass": failing,
                "clean_failures": clean_failures,
                "timeout": round(max(60.0, 10 * clean.seconds), 1),
            },
        },
        "metadata": {
            "mutation": mutation.to_json(),
            "oracle": [mutation.hunk.reversed().to_json()],
            "oracle_edit": oracle_edit(buggy_source, mutation),
        },
    }


def fix_diff(task_json_value: dict[str, Any], buggy_source: str, clean_source: str) -> str:
    """The oracle fix as a unified diff (buggy -> clean), for readers of the suite."""
    path = task_json_value["metadata"]["mutation"]["path"]
    return "".join(
        difflib.unified_diff(
            buggy_source.splitlines(True), clean_source.splitlines(True), f"a/{path}", f"b/{path}", n=3
        )
    )


# ---- scripted policies ------------------------------------------------------------------------


def oracle_actions(task: CodeTask) -> list:
    """The oracle's episode: the fix as one str_replace, then submit."""
    edit = (task.raw.get("metadata") or {}).get("oracle_edit")
    if edit is None:
        raise ValueError(f"{task.id}: metadata.oracle_edit is missing")
    return [Edit("str_replace", edit["path"], old_str=edit["old_str"], new_str=edit["new_str"]), Submit()]


def noop_actions(task: CodeTask) -> list:
    return [Submit()]


class RandomPolicy:
    """A random policy over the action space's useful moves: each turn, with equal chance,
    run a shell command from a fixed list, view a random source file, or rewrite a random line
    of a random source file by one random mutation (cua_jax.tasks.bug_injection, applied with
    str_replace); it submits after `turns` turns. Seeded per (seed, task)."""

    COMMANDS = ("ls", "git status", "python -m pytest -x -q", "grep -rn def . | head", "cat setup.py")

    def __init__(self, seed: int, turns: int = 4):
        self.seed, self.turns = seed, turns

    def actions(self, task: CodeTask, sources: dict[str, str]) -> list:
        rng = random.Random(f"{self.seed}:{task.id}")
        package = PACKAGES[task.package]
        buggy = {p: t for p, t in sources.items()}
        for hunk in task.bug:
            buggy[hunk.path] = apply_hunks(buggy[hunk.path], [hunk])
        out = []
        for _ in range(self.turns):
            move = rng.randrange(3)
            if move == 0:
                out.append(Bash(rng.choice(self.COMMANDS), timeout=60))
            elif move == 1:
                out.append(Edit("view", rng.choice(package.sources)))
            else:
                path = rng.choice(package.sources)
                candidates = mutations(buggy[path], path)
                if not candidates:
                    continue
                m = rng.choice(candidates)
                try:
                    edit = oracle_edit(m.apply(buggy[path]), m)  # its reverse, read backwards
                except ValueError:
                    continue
                out.append(Edit("str_replace", path, old_str=edit["new_str"], new_str=edit["old_str"]))
                buggy[path] = m.apply(buggy[path])
        return out + [Submit()]
