"""Task JSON validation: good tasks load, bad ones name the offending field."""

import copy
import json

import pytest

from cua_jax.tasks.schema import TaskSchemaError, load_suite, load_task, parse_task
from cua_jax.tasks.suites.desktop.solutions import SOLUTIONS, SUITE_DIR, WRONG_SOLUTIONS

GOOD = {
    "id": "t1",
    "instruction": "do it",
    "config": [{"type": "sleep", "parameters": {"seconds": 1}},
               {"type": "upload", "parameters": {"files": [{"local_path": "a", "path": "/b"}]}}],
    "evaluator": {
        "func": ["exact_match", "compare_text_file"],
        "conj": "or",
        "result": [{"type": "vm_command_line", "command": "cat /x"}, {"type": "vm_file", "path": "/x"}],
        "expected": [{"type": "rule", "rules": {"expected": "y"}}, {"type": "local_file", "path": "x"}],
        "options": [{}, {"ignore_blanks": True}],
        "postconfig": [{"type": "execute", "parameters": {"command": ["true"]}}],
    },
}


def test_good_task_parses():
    task = parse_task(GOOD, "/somewhere")
    assert task.id == "t1" and task.base_dir == "/somewhere"
    assert [c.func for c in task.evaluator.checks] == ["exact_match", "compare_text_file"]
    assert task.evaluator.checks[1].options == {"ignore_blanks": True}
    assert task.evaluator.conj == "or" and task.evaluator.postconfig[0].type == "execute"


def test_suite_loads_and_every_task_has_both_solutions():
    tasks = load_suite(SUITE_DIR)
    assert len(tasks) >= 4
    assert {t.id for t in tasks} == set(SOLUTIONS) == set(WRONG_SOLUTIONS)


def mutated(path, value):
    task = copy.deepcopy(GOOD)
    target = task
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return task


@pytest.mark.parametrize(
    "path, value, fragment",
    [
        (["instruction"], KeyError, "instruction: is required"),
        (["instruction"], 3, "instruction: must be str"),
        (["id"], "", "id: must not be empty"),
        (["config", 0, "type"], "teleport", "config[0].type: unknown setup step 'teleport'"),
        (["config", 0, "parameters", "seconds"], "1", "config[0].parameters.seconds: must be int/float"),
        (["config", 0, "parameters", "seconds"], True, "config[0].parameters.seconds: must be int/float"),
        (["config", 1, "parameters", "files", 0, "path"], "", "config[1].parameters.files[0].path: must not be empty"),
        (["config", 1, "parameters", "extra"], 1, "config[1].parameters.extra: 'upload' takes no parameter 'extra'"),
        (["evaluator", "func", 1], "guess", "evaluator.func[1]: unknown metric 'guess'"),
        (["evaluator", "result", 0, "type"], "vm_magic", "evaluator.result[0].type: unknown getter 'vm_magic'"),
        (["evaluator", "expected", 1, "path"], KeyError, "evaluator.expected[1].path: getter 'local_file' needs parameter 'path'"),
        (["evaluator", "conj"], "xor", "evaluator.conj: must be 'and' or 'or'"),
        (["evaluator", "options"], [{}], "evaluator.options: lists 1 entries but 'func' lists 2"),
        (["evaluator", "postconfig", 0, "parameters", "command"], [], "evaluator.postconfig[0].parameters.command"),
        (["evaluator"], KeyError, "evaluator: is required"),
    ],
)
def test_bad_fields_are_named(path, value, fragment):
    with pytest.raises(TaskSchemaError) as caught:
        parse_task(mutated(path, value))
    assert fragment in str(caught.value)
    assert "task 't1'" in str(caught.value) or path == ["id"]


def test_python_judge_needs_valid_code_defining_its_entry():
    task = {"id": "j", "instruction": "x", "evaluator": {"func": "python_judge", "code": "def f(:", "entry": "f"}}
    with pytest.raises(TaskSchemaError, match="evaluator.code: is not valid Python"):
        parse_task(task)
    task["evaluator"]["code"] = "def g():\n    return 1\n"
    with pytest.raises(TaskSchemaError, match="evaluator.entry: the code defines no function 'f'"):
        parse_task(task)


def test_load_task_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(TaskSchemaError, match="broken.json: not valid JSON"):
        load_task(path)
    path.write_text(json.dumps({"id": "x", "instruction": "y", "evaluator": {"func": "nope"}}))
    with pytest.raises(TaskSchemaError, match=r"broken.json: task 'x': evaluator.func: unknown metric"):
        load_task(path)
