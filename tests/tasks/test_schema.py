"""Task JSON validation: good tasks load, bad ones name the offending field."""

import copy
import json

import pytest

from cua_jax.tasks.schema import TaskSchemaError, load_suite, load_task, parse_task
from cua_jax.tasks.suites.desktop.solutions import SOLUTIONS, SUITE_DIR, WRONG_SOLUTIONS

GOOD = {
    "id": "t1",
    "instruction": "do it",
    "config": [
        {"type": "sleep", "parameters": {"seconds": 1}},
        {"type": "upload", "parameters": {"files": [{"local_path": "a", "path": "/b"}]}},
    ],
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
        (
            ["evaluator", "expected", 1, "path"],
            KeyError,
            "evaluator.expected[1].path: getter 'local_file' needs parameter 'path'",
        ),
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


# ------------------------------------------------------------------------------------
# OSWorld's setup steps and getters, in OSWorld's own shapes
# ------------------------------------------------------------------------------------

OSWORLD_STEPS = [
    {
        "type": "download",
        "parameters": {"files": [{"url": "https://huggingface.co/x/a.xlsx", "path": "/home/user/a.xlsx"}]},
    },
    {"type": "upload", "parameters": {"files": [{"local_path": "a", "path": "/b"}]}},
    {"type": "upload_file", "parameters": {"files": [{"local_path": "a", "path": "/b"}]}},
    {"type": "open", "parameters": {"path": "/home/user/a.xlsx"}},
    {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
    {"type": "launch", "parameters": {"command": "VLC_VERBOSE=-1 vlc", "shell": "true"}},
    {
        "type": "execute",
        "parameters": {"command": ["python", "-c", "import pyautogui; pyautogui.click({SCREEN_WIDTH_HALF}, 1)"]},
    },
    {
        "type": "execute",
        "parameters": {
            "command": "ls",
            "shell": True,
            "stdout": "ls.out",
            "stderr": "ls.err",
            "until": {"returncode": 0},
            "timeout": 5,
            "check": False,
        },
    },
    {"type": "command", "parameters": {"command": ["mkdir", "-p", "/home/user/d"]}},
    {"type": "sleep", "parameters": {"seconds": 0.5}},
    {"type": "activate_window", "parameters": {"window_name": "a.xlsx - LibreOffice Calc", "strict": True}},
    {"type": "close_window", "parameters": {"window_name": "gnome-terminal-server", "strict": True, "by_class": True}},
    {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://www.example.org"]}},
    {"type": "chrome_close_tabs", "parameters": {"urls_to_close": ["https://www.example.org"]}},
    {"type": "change_wallpaper", "parameters": {"path": "/home/user/w.png"}},
    {
        "type": "execute_with_verification",
        "parameters": {
            "command": ["x"],
            "verification": {"window_exists": "x"},
            "max_wait_time": 10,
            "check_interval": 1.0,
            "shell": False,
        },
    },
    {"type": "tidy_desktop", "parameters": {"anything": 1}},
    {"type": "act", "parameters": {"action_seq": []}},
    {"type": "replay", "parameters": {"trajectory": "t.json"}},
    {"type": "proxy", "parameters": {"client_password": "password"}},
    {"type": "googledrive", "parameters": {"settings_file": "s.yml", "operation": ["delete"], "args": [{"query": ""}]}},
    {"type": "login", "parameters": {"settings_file": "s.json", "platform": "googledrive"}},
    {
        "type": "update_browse_history",
        "parameters": {"history": [{"url": "https://x.org", "title": "x", "visit_time_from_now_in_seconds": 5}]},
    },
]
OSWORLD_GETTERS = [
    {"type": "vm_file", "path": "/home/user/a.xlsx", "dest": "a.xlsx"},
    {"type": "vm_file", "path": ["/a", "/b"], "dest": ["a", "b"], "multi": True, "gives": [0, 1]},
    {"type": "vm_file", "path": "/a.txt", "dest": "a.txt", "time_suffix": True, "time_format": "%Y"},
    {"type": "cloud_file", "path": ["https://h/a", "https://h/b"], "dest": ["a", "b"], "multi": "true", "gives": [1]},
    {"type": "cache_file", "path": "diff.out"},
    {"type": "local_file", "path": "files/x.txt"},
    {"type": "content_from_vm_file", "path": "/a.xlsx", "file_type": "xlsx", "file_content": "last_row"},
    {"type": "vm_command_line", "command": "ls ~", "shell": True},
    {"type": "vm_command_error", "command": ["ls", "/nope"]},
    {"type": "vm_terminal_output"},
    {"type": "accessibility_tree"},
    {"type": "list_directory", "path": "/home/user/Desktop"},
    {"type": "vm_screen_size"},
    {"type": "vm_window_size", "app_class_name": "gnome-terminal-server"},
    {"type": "vm_wallpaper", "dest": "w.png"},
    {"type": "rule", "rules": {"expected": 1}},
    {"type": "rule_relativeTime", "rules": {"relativeTime": {"from": "tomorrow"}, "expected": {"time": "{Year}"}}},
    {"type": "time_diff_range", "diff_range_in_minutes": 5},
    {"type": "gimp_config_file", "file_name": "gimprc", "dest": "gimprc"},
    {"type": "vlc_config", "dest": "vlcrc"},
    {"type": "vlc_playing_info", "dest": "status.xml"},
    {"type": "default_video_player"},
    {"type": "vscode_config", "vscode_extension_command": "OpenProject", "path": "/x.json", "dest": "x.json"},
    {"type": "audio_in_slide", "ppt_file_path": "/a.pptx", "slide_index": 0, "dest": "a.mp3"},
    {"type": "background_image_in_slide", "ppt_file_path": "/a.pptx", "slide_index": "1", "dest": "bg.png"},
    {"type": "conference_city_in_order", "csv_path": "c.csv"},
    {"type": "active_tab_html_parse", "goto_prefix": "https://www.", "category": "class", "class_singleObject": {}},
    {"type": "googledrive_file", "settings_file": "s.yml", "path_list": [["a"]], "dest": ["a"]},
]


def osworld(config=(), getters=()):
    return {
        "id": "osworld",
        "snapshot": "chrome",
        "instruction": "x",
        "source": "https://x",
        "trajectory": "t/",
        "related_apps": ["chrome"],
        "proxy": False,
        "fixed_ip": False,
        "possibility_of_env_change": "low",
        "config": list(config),
        "evaluator": {
            "func": ["exact_match"] * len(getters),
            "result": list(getters),
            "expected": [{"type": "rule", "rules": {"expected": 1}}] * len(getters),
            "options": [None] * len(getters),
            "postconfig": list(config),
        }
        if getters
        else {"func": "infeasible", "postconfig": list(config)},
    }


def test_every_osworld_step_type_parses():
    from cua_jax.tasks.schema import SETUP_STEPS

    task = parse_task(osworld(OSWORLD_STEPS))
    assert {step.type for step in task.config} == set(SETUP_STEPS)
    assert len(task.evaluator.postconfig) == len(OSWORLD_STEPS)
    launch = task.config[5]
    assert launch.parameters["shell"] is True  # OSWorld's "true" strings are booleans
    assert task.config[7].parameters["until"] == {"returncode": 0}


def test_every_osworld_getter_type_parses():
    from cua_jax.tasks.schema import GETTERS

    getters = OSWORLD_GETTERS + [
        {"type": name} for name in GETTERS if name not in {g["type"] for g in OSWORLD_GETTERS} and not GETTERS[name][0]
    ]
    task = parse_task(osworld(getters=getters))
    checks = task.evaluator.checks
    assert [c.result.type for c in checks] == [g["type"] for g in getters]
    assert checks[1].result.parameters["path"] == ["/a", "/b"] and checks[3].result.parameters["multi"] is True
    assert checks[24].result.parameters["slide_index"] == 1
    assert {g["type"] for g in getters} == set(GETTERS)


def test_osworld_evaluator_shapes():
    # rules may be a list (check_accessibility_tree's selectors); a source may list several pages
    task = parse_task(
        {
            "id": "s",
            "instruction": "x",
            "source": ["https://a", "https://b"],
            "evaluator": {
                "func": "exact_match",
                "result": {"type": "accessibility_tree"},
                "expected": {"type": "rule", "rules": [{"selectors": ["label[name=To]"]}]},
            },
        }
    )
    assert task.evaluator.checks[0].expected.parameters["rules"] == [{"selectors": ["label[name=To]"]}]
    assert task.source == "https://a https://b"
    # {} means no getter; null options are {}; one getter is shared by a single metric
    task = parse_task(
        {
            "id": "s",
            "instruction": "x",
            "evaluator": {"func": "infeasible", "result": {}, "expected": {}, "options": None},
        }
    )
    assert task.evaluator.checks[0].result is None and task.evaluator.checks[0].options == {}
    task = parse_task(
        {
            "id": "s",
            "instruction": "x",
            "evaluator": {
                "func": ["infeasible", "exact_match"],
                "result": [None, {"type": "vm_terminal_output"}],
                "expected": [{}, {"type": "rule", "rules": {"expected": "x"}}],
                "options": [None, {"a": 1}],
            },
        }
    )
    assert task.evaluator.checks[0].result is None and task.evaluator.checks[1].options == {"a": 1}


def exact_match_of(result):
    """An evaluator comparing `result` by exact_match with an empty rule."""
    return {"func": "exact_match", "result": result, "expected": {"type": "rule", "rules": {}}}


@pytest.mark.parametrize(
    "evaluator, fragment",
    [
        ({"func": ""}, "evaluator.func: must name at least one metric"),
        (
            exact_match_of([{"type": "vm_terminal_output"}]),
            "evaluator.result: must be one object when 'func' names one metric",
        ),
        (
            exact_match_of({"type": "vm_file", "path": ["/a", "/b"]}),
            "evaluator.result.path: must be a non-empty string (a list needs 'multi': true)",
        ),
        (
            exact_match_of({"type": "vm_file", "path": ["/a", "/b"], "multi": True, "dest": ["a"]}),
            "evaluator.result.dest: must list one file name per path (2)",
        ),
        (
            exact_match_of({"type": "vm_file", "path": ["/a"], "multi": True, "gives": [1]}),
            "evaluator.result.gives: must be a non-empty list of file indices in [0, 1)",
        ),
        (
            exact_match_of({"type": "vm_file", "path": "/a", "dest": "../a"}),
            "evaluator.result.dest: must be a file name (no folders)",
        ),
        (
            exact_match_of({"type": "cache_file", "path": "sub/x"}),
            "evaluator.result.path: must be a file name",
        ),
        (
            exact_match_of({"type": "vm_window_size"}),
            "evaluator.result.app_class_name: getter 'vm_window_size' needs parameter 'app_class_name'",
        ),
        (
            exact_match_of({"type": "vm_file", "path": "/a", "multi": "maybe"}),
            "evaluator.result.multi: must be true or false",
        ),
        (
            exact_match_of({"type": "calc_insensitive_md5"}),
            "evaluator.result.type: unknown getter 'calc_insensitive_md5'",
        ),
        (
            exact_match_of({"type": "audio_in_slide", "ppt_file_path": "/a", "slide_index": -1, "dest": "a"}),
            "evaluator.result.slide_index: must be an integer >= 0",
        ),
    ],
)
def test_bad_osworld_evaluators_name_their_field(evaluator, fragment):
    with pytest.raises(TaskSchemaError) as caught:
        parse_task({"id": "b", "instruction": "x", "evaluator": evaluator})
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    "step, fragment",
    [
        (
            {"type": "activate_window", "parameters": {"strict": True}},
            "config[0].parameters.window_name: 'activate_window' needs parameter",
        ),
        (
            {"type": "activate_window", "parameters": {"window_name": " "}},
            "config[0].parameters.window_name: must not be empty",
        ),
        (
            {"type": "close_window", "parameters": {"window_name": "x", "strict": "yes"}},
            "config[0].parameters.strict: must be true or false",
        ),
        (
            {"type": "chrome_open_tabs", "parameters": {"urls_to_open": []}},
            "config[0].parameters.urls_to_open: must be a non-empty list",
        ),
        (
            {"type": "execute", "parameters": {"command": "x", "until": {"exit": 0}}},
            "config[0].parameters.until: knows returncode",
        ),
        (
            {"type": "execute", "parameters": {"command": "x", "stdout": "/tmp/out"}},
            "config[0].parameters.stdout: must be a file name",
        ),
        (
            {"type": "execute", "parameters": {"command": "x", "timeout": 0}},
            "config[0].parameters.timeout: must be > 0",
        ),
        (
            {"type": "googledrive", "parameters": {"operation": ["delete"]}},
            "config[0].parameters.args: 'googledrive' needs parameter",
        ),
        (
            {"type": "download", "parameters": {"files": [{"url": "https://x"}]}},
            "config[0].parameters.files[0].path: is required",
        ),
    ],
)
def test_bad_osworld_steps_name_their_field(step, fragment):
    with pytest.raises(TaskSchemaError) as caught:
        parse_task({"id": "b", "instruction": "x", "config": [step], "evaluator": {"func": "infeasible"}})
    assert fragment in str(caught.value)
