"""Bug injection (pure AST mutations), the code task format, the judge's verdict rule, and the
committed code suite."""

import ast
import collections
import inspect
import json
import pathlib
import textwrap

import pytest

from cua_jax.tasks import bug_injection as B
from cua_jax.tasks import code_suite as S
from cua_jax.tasks.code_packages import PACKAGES
from cua_jax.tasks.code_tasks import CodeTaskError, Hunk, load_code_suite, parse_code_task, verdict

SUITE = pathlib.Path(__file__).resolve().parents[2] / "cua_jax" / "tasks" / "suites" / "code"

SOURCE = textwrap.dedent('''\
    """Module docstring with < and 1."""
    __version__ = "1.0"


    def window(items, n=2, strict=False):
        """Docstring: 3 > 2."""
        if n < 1:  # a comment that stays
            raise ValueError("n must be positive")
        out = []
        for i in range(len(items) - n + 1):
            if strict and items[i] is None:
                continue
            out.append(items[i:i + n])
        return out
    ''')


def by_kind(mutations):
    found = collections.defaultdict(list)
    for m in mutations:
        found[m.kind].append((m.description, m.hunk.new))
    return found


def test_each_kind_edits_only_its_site():
    found = by_kind(B.mutations(SOURCE, "w.py"))
    assert set(found) == set(B.KINDS)
    assert ("`<` -> `<=`", ("    if n <= 1:  # a comment that stays",)) in found["swapped operator"]
    assert ("`and` -> `or`", ("        if strict or items[i] is None:",)) in found["swapped operator"]
    assert ("`is` -> `is not`", ("        if strict and items[i] is not None:",)) in found["swapped operator"]
    assert ("`-` -> `+`", ("    for i in range(len(items) + n + 1):",)) in found["swapped operator"]
    assert ("`1` -> `2`", ("    for i in range(len(items) - n + 2):",)) in found["off-by-one"]
    assert ("`1` -> `0`", ("    if n < 0:  # a comment that stays",)) in found["off-by-one"]
    assert ("`False` -> `True`", ("def window(items, n=2, strict=True):",)) in found["wrong constant"]
    removed = dict(found["removed branch"])
    assert removed["removed `if n < 1:` and its block (2 lines)"] == ("    out = []",)
    assert removed["removed `if strict and items[i] is None:` and its block (2 lines)"] == (
        "        out.append(items[i:i + n])",
    )
    # docstrings and dunder values are never touched
    for m in B.mutations(SOURCE, "w.py"):
        assert m.line not in (1, 2, 6), m


@pytest.mark.parametrize("module", [textwrap, collections, json.decoder])
def test_every_mutation_parses_differs_and_reverses_exactly(module):
    source = inspect.getsource(module)
    mutations = B.mutations(source, "m.py")
    assert len(mutations) > 20
    original = ast.dump(ast.parse(source))
    for m in mutations[:: max(1, len(mutations) // 60)]:  # whole-module parses are slow: a spread sample
        buggy = m.apply(source)
        assert ast.dump(ast.parse(buggy)) != original
        assert B.apply_hunks(buggy, [m.hunk.reversed()]) == source
        assert len(buggy.split("\n")) - len(source.split("\n")) == len(m.hunk.new) - len(m.hunk.old)


def test_a_hunk_that_does_not_match_is_refused():
    with pytest.raises(ValueError, match="w.py:3"):
        B.apply_hunks(SOURCE, [Hunk("w.py", 3, ("nope",), ("x",))])


def test_sampling_is_seeded_and_round_robin_over_kinds():
    mutations = B.mutations(inspect.getsource(textwrap), "m.py")
    first = B.sample_mutations(mutations, 12, seed=3)
    assert first == B.sample_mutations(mutations, 12, seed=3) != B.sample_mutations(mutations, 12, seed=4)
    assert collections.Counter(m.kind for m in first[:8]) == {k: 2 for k in B.KINDS}
    assert len(set(first)) == 12


def _task(**changes):
    value = {
        "id": "t1",
        "snapshot": "code",
        "instruction": "fix it",
        "config": [
            {
                "type": "code_repository",
                "parameters": {"package": "toolz", "bug": [{"path": "a.py", "start": 1, "old": ["x"], "new": ["y"]}]},
            }
        ],
        "evaluator": {"func": "pytest", "options": {"test_files": ["tests"], "fail_to_pass": ["t::a", "t::b"]}},
    }
    for path, new in changes.items():
        target = value
        keys = path.split(".")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        target[keys[-1]] = new
    return value


@pytest.mark.parametrize(
    "path, value, field",
    [
        ("snapshot", "desktop", "snapshot"),
        ("config.0.type", "download", "config"),
        ("config.0.parameters.bug", [{"path": "/etc/x", "start": 1, "old": [], "new": []}], "bug[0].path"),
        ("config.0.parameters.bug", [{"path": "a.py", "start": 0, "old": [], "new": []}], "bug[0].start"),
        ("evaluator.func", "exact_match", "evaluator.func"),
        ("evaluator.options.fail_to_pass", [], "fail_to_pass"),
        ("instruction", " ", "instruction"),
    ],
)
def test_a_malformed_task_names_its_field(path, value, field):
    with pytest.raises(CodeTaskError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_code_task(_task(**{path: value}), "x.json")


def test_verdict_all_pass_partial_credit_and_regressions():
    task = parse_code_task(_task(), "x.json")
    assert task.oracle == (Hunk("a.py", 1, ("y",), ("x",)),)
    ok = {"t::a": "passed", "t::b": "passed", "t::c": "passed"}
    assert verdict(task, ok).reward == 1.0 and verdict(task, ok).solved
    half = {**ok, "t::b": "failed"}
    assert verdict(task, half).reward == 0.0 and verdict(task, half, partial_credit=True).reward == 0.5
    regression = {**ok, "t::c": "error"}
    assert verdict(task, regression).broken == ("t::c",) and verdict(task, regression, partial_credit=True).reward == 0
    assert verdict(task, {"t::a": "passed"}).reward == 0.0  # a test that did not run did not pass


def test_fail_to_pass_keeps_focused_mutants_only():
    clean = S.TestRun({"a": "passed", "b": "passed", "c": "skipped"}, {}, 1.0)
    assert S.fail_to_pass(clean, S.TestRun({"a": "failed", "b": "passed", "c": "skipped"}, {}, 1.0)) == ["a"]
    assert S.fail_to_pass(clean, S.TestRun(dict(clean.outcomes), {}, 1.0)) is None  # nothing broke
    assert S.fail_to_pass(clean, S.TestRun({"a": "failed", "b": "passed"}, {}, 1.0)) is None  # a test vanished
    assert S.fail_to_pass(clean, S.TestRun({"a": "failed", "b": "passed", "c": "failed"}, {}, 1.0)) is None


def test_oracle_edit_is_unique_and_undoes_the_bug():
    m = next(m for m in B.mutations(SOURCE, "w.py") if m.description == "`1` -> `0`")
    buggy = m.apply(SOURCE)
    edit = S.oracle_edit(buggy, m)
    assert buggy.count(edit["old_str"]) == 1
    assert buggy.replace(edit["old_str"], edit["new_str"]) == SOURCE


def test_the_committed_suite_has_100_validated_tasks_over_5_packages():
    tasks = load_code_suite(SUITE)
    packages = collections.Counter(t.package for t in tasks)
    assert len(tasks) >= 100 and len(packages) >= 5 and set(packages) <= set(PACKAGES)
    for task in tasks:
        assert (SUITE / "patches" / f"{task.id}.diff").is_file()
        assert task.fail_to_pass[0].split("::")[-1].split("[")[0] in task.instruction
    validation = json.loads((SUITE / "validation.json").read_text())
    assert set(validation["tasks"]) == {t.id for t in tasks}
    assert all(row["oracle"] == 1.0 and row["noop"] == 0.0 for row in validation["tasks"].values())


def test_mutants_are_kept_by_their_fail_to_pass_tests_on_a_real_container():
    from cua_jax.environments.code_env import CodeContainer, CodeEnvConfig
    from cua_jax.envs.images import ensure_image

    task = next(t for t in load_code_suite(SUITE) if t.package == "inflection")
    package = PACKAGES["inflection"]
    container = CodeContainer(CodeEnvConfig(), ensure_image("code")).start()
    try:
        clean = S.clean_run(container, package)
        assert sum(o == "passed" for o in clean.outcomes.values()) > 400
        mutant = S.run_tests(container, package, list(task.bug), timeout=120)
        assert S.fail_to_pass(clean, mutant) == list(task.fail_to_pass)
        # a bug that stops the module from importing takes every test with it: not kept
        source = S.read_clean_file(container, package.name, "inflection/__init__.py")
        first = source.split("\n")[0]
        broken = Hunk("inflection/__init__.py", 1, (first,), ("raise ImportError('broken')",))
        mutant = S.run_tests(container, package, [broken], timeout=120)
        assert mutant is not None and S.fail_to_pass(clean, mutant) is None
    finally:
        container.remove()
