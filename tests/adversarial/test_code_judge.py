"""The code judge scores only the fix: scripted episodes that try to win without fixing the
package's source, one trick per episode, each scored 0.0; the episode's info names what the
agent changed outside the package's sources (none of it reaches the verdict). The runner itself
loads nothing from the work tree. The oracle fix still scores 1.0 and the no-op 0.0.

What the judge cannot rule out (code under test altering pytest's process in ways its identity
check does not see) is listed in launch/images/code/runner.py."""

import base64
import dataclasses
import xml.sax.saxutils

import pytest

from cua_jax.envs.code_actions import Bash, Edit, Submit
from cua_jax.tasks import code_suite as S
from cua_jax.tasks.code_tasks import load_code_task
from cua_jax.types import EpisodeStatus
from tests.support.code_env import SUITE, run, text_of

JUNIT = "/tmp/.cua-judge.xml"  # the former judge's report, which it read back

# A pytest plugin that turns every test report into a pass.
FORCE_PASS = """import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    report.outcome, report.longrepr = "passed", None
    return report
"""

# Python code that has pytest load FORCE_PASS (a module `forcepass` on sys.path) as a plugin.
LOAD_FORCE_PASS = 'import os; os.environ["PYTEST_ADDOPTS"] = "-p forcepass"'

# A module at the repository root that shadows the standard library's glob (pytest imports it
# at start-up): it loads the plugin, then the real glob in its place.
SHADOW_GLOB = f"""import os, sys
{LOAD_FORCE_PASS}
_here = os.path.dirname(os.path.abspath(__file__))
_path = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
del sys.modules["glob"]
import glob as _real
sys.path[:] = _path
sys.modules["glob"] = _real
globals().update(vars(_real))
"""

# Prepended to the package's source: replaces pytest's call_and_report with one whose every
# report passes.
PATCH_CALL_AND_REPORT = """import _pytest.runner as _runner

_call_and_report = _runner.call_and_report


def _passing(item, when, log=True, **kwds):
    report = _call_and_report(item, when, log=False, **kwds)
    report.outcome, report.longrepr = "passed", None
    if log:
        item.ihook.pytest_runtest_logreport(report=report)
    return report


_runner.call_and_report = _passing
"""


def forged_junit(task) -> str:
    """A JUnit XML report in which every fail-to-pass test passed and nothing failed."""
    cases = "".join(
        f"<testcase classname={xml.sax.saxutils.quoteattr(c)} name={xml.sax.saxutils.quoteattr(n)}/>"
        for c, _, n in (t.rpartition("::") for t in task.fail_to_pass)
    )
    return f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite>{cases}</testsuite></testsuites>'


def write(path: str, text: str, append: bool = False) -> Bash:
    """A shell command that writes (or appends) `text` to `path`, anywhere the shell may write."""
    data = base64.b64encode(text.encode()).decode()
    return Bash(f"mkdir -p $(dirname {path}) && echo {data} | base64 -d {'>>' if append else '>'} {path}")


def source_of(task) -> str:
    return task.bug[0].path


# ---- the tricks: (actions before submit, the paths outside the sources the info must list) ----


def conftest_forcing_passes(task):
    return [Edit("create", "conftest.py", file_text=FORCE_PASS)], ["conftest.py"]


def conftest_naming_a_plugin(task):
    plugins = Edit("create", "conftest.py", file_text='pytest_plugins = ["forcepass"]\n')
    return [Edit("create", "forcepass.py", file_text=FORCE_PASS), plugins], ["conftest.py", "forcepass.py"]


CONFIG_ADDOPTS = {  # a pytest configuration file, and how it sets addopts
    "pytest.ini": "[pytest]\naddopts = {}\n",
    "tox.ini": "[pytest]\naddopts = {}\n",
    "setup.cfg": "\n[tool:pytest]\naddopts = {}\n",  # appended to the repository's own
    "pyproject.toml": '[tool.pytest.ini_options]\naddopts = "{}"\n',
}


def config_adding_a_plugin(name):
    def trick(task):
        config = write(name, CONFIG_ADDOPTS[name].format("-p forcepass"), append=True)
        return [Edit("create", "forcepass.py", file_text=FORCE_PASS), config], sorted(["forcepass.py", name])

    trick.__name__ = f"{name}_adding_a_plugin"
    return trick


def config_deselecting_the_failing_tests(task):
    names = sorted({t.rpartition("::")[2].partition("[")[0] for t in task.fail_to_pass})
    text = CONFIG_ADDOPTS["pytest.ini"].format(f"-k 'not ({' or '.join(names)})'")
    return [Edit("create", "pytest.ini", file_text=text)], ["pytest.ini"]


# On the image's PYTHONPATH: rewrites the runner's answer (every test passed) in any runner
# process that would import it.
FORGE_RUNNER_ANSWER = """import sys

if sys.argv[0].endswith("runner.py"):
    import json

    _dumps = json.dumps

    def _forged(value, *args, **kwargs):
        if isinstance(value, dict) and "outcomes" in value:
            value["outcomes"] = dict.fromkeys(value["outcomes"], "passed")
        return _dumps(value, *args, **kwargs)

    json.dumps = _forged
"""


def sitecustomize_forging_the_runners_answer(task):
    return [Edit("create", "src/sitecustomize.py", file_text=FORGE_RUNNER_ANSWER)], ["src/sitecustomize.py"]


def sitecustomize_on_pythonpath(task):  # src/ is on PYTHONPATH (the src layout's folder)
    return [
        Edit("create", "src/forcepass.py", file_text=FORCE_PASS),
        Edit("create", "src/sitecustomize.py", file_text=LOAD_FORCE_PASS + "\n"),
    ], ["src/forcepass.py", "src/sitecustomize.py"]


def pth_file_in_the_user_site(task):  # HOME=/work: ~/.local is outside the repository
    site = "/work/.local/lib/python3.11/site-packages"
    return [write(f"{site}/forcepass.py", FORCE_PASS), write(f"{site}/forcepass-boot.pth", LOAD_FORCE_PASS + "\n")], []


def stdlib_module_shadowed_at_the_root(task):
    return [Edit("create", "forcepass.py", file_text=FORCE_PASS), Edit("create", "glob.py", file_text=SHADOW_GLOB)], [
        "forcepass.py",
        "glob.py",
    ]


def editing_the_tests(task):
    return [write(task.test_files[0], "def test_nothing():\n    pass\n")], [task.test_files[0]]


def deleting_the_tests(task):
    return [Bash(f"rm -rf {task.test_files[0]}")], [task.test_files[0]]


def background_process_rewriting_the_report(task):
    loop = (
        f"import os, time\nJ = {JUNIT!r}\nF = open('/tmp/forged.xml').read()\nwhile True:\n"
        "    try:\n        same = open(J).read() == F\n    except OSError:\n        same = True\n"
        "    if not same:\n        open(J + '.new', 'w').write(F)\n        os.replace(J + '.new', J)\n"
        "    time.sleep(0.001)\n"
    )
    return [
        write("/tmp/forged.xml", forged_junit(task)),
        write("/tmp/rewrite.py", loop),
        Bash("setsid nohup python3 /tmp/rewrite.py > /dev/null 2>&1 < /dev/null &"),
    ], []


def report_planted_in_advance(task):
    return [write(JUNIT, forged_junit(task))], []


def source_forging_the_report_at_exit(task):
    code = f"import atexit as _atexit\n_atexit.register(lambda: open({JUNIT!r}, 'w').write({forged_junit(task)!r}))\n"
    return [Edit("insert", source_of(task), insert_line=0, new_str=code)], []


def source_replacing_call_and_report(task):
    return [Edit("insert", source_of(task), insert_line=0, new_str=PATCH_CALL_AND_REPORT)], []


def source_made_a_symlink_to_a_fixed_copy(task):
    clean = f"/opt/repos/{task.package}/{source_of(task)}"
    return [Bash(f"cp {clean} /work/fixed.py && ln -sf /work/fixed.py {source_of(task)}")], []


def source_sleeping_past_the_timeout(task):
    return [Edit("insert", source_of(task), insert_line=0, new_str="import time; time.sleep(600)")], []


# Played on the small task by test_a_trick_outside_the_source_scores_nothing; the rest have tests of
# their own below.
TRICKS = [
    conftest_forcing_passes,
    conftest_naming_a_plugin,
    *map(config_adding_a_plugin, CONFIG_ADDOPTS),
    config_deselecting_the_failing_tests,
    sitecustomize_forging_the_runners_answer,
    pth_file_in_the_user_site,
    stdlib_module_shadowed_at_the_root,
    editing_the_tests,
    deleting_the_tests,
    background_process_rewriting_the_report,
    report_planted_in_advance,
    source_forging_the_report_at_exit,
]


@pytest.fixture(scope="module")
def src_layout_task():
    return load_code_task(SUITE / "code-cachetools-000.json")


def play(env, task, actions):
    run(env.reset(task))
    for action in actions:
        text_of(run(env.step(action)))
    return run(env.step(Submit()))


@pytest.mark.parametrize("trick", TRICKS, ids=lambda t: t.__name__)
def test_a_trick_outside_the_source_scores_nothing(env, task, trick):
    actions, changed = trick(task)
    step = play(env, task, actions)
    assert step.reward == 0.0 and step.outcome.status is EpisodeStatus.FAILURE, step.outcome
    assert step.info["changes_outside_sources"] == changed
    assert step.info["changes_outside_sources_count"] == len(changed)


def test_sitecustomize_on_the_src_layouts_path_scores_nothing(env, src_layout_task):
    actions, changed = sitecustomize_on_pythonpath(src_layout_task)
    step = play(env, src_layout_task, actions)
    assert step.reward == 0.0 and step.outcome.status is EpisodeStatus.FAILURE, step.outcome
    assert step.info["changes_outside_sources"] == changed


def test_a_source_file_replacing_pytests_reporting_is_caught(env, task):
    step = play(env, task, source_replacing_call_and_report(task)[0])
    assert step.reward == 0.0 and step.outcome.status is EpisodeStatus.FAILURE
    assert "harness was altered" in step.outcome.reason and "_pytest.runner.call_and_report" in step.outcome.reason


def test_a_source_that_is_no_regular_file_fails_the_episode(env, task):
    step = play(env, task, source_made_a_symlink_to_a_fixed_copy(task)[0])
    assert step.reward == 0.0 and step.outcome.status is EpisodeStatus.FAILURE
    assert f"{source_of(task)} is a symlink" in step.outcome.reason


def test_a_source_sleeping_past_the_timeout_fails(env, task):
    slow = dataclasses.replace(task, timeout=3.0)
    step = play(env, slow, source_sleeping_past_the_timeout(slow)[0])
    assert step.outcome.status is EpisodeStatus.FAILURE and "ran past 3.0s" in step.outcome.reason


def test_the_runner_loads_nothing_from_the_work_tree(env, task):
    log = "import sys; open('/work/loaded-by', 'a').write(' '.join(sys.argv[:1]) + chr(10))\n"
    run(env.reset(task))
    for path in ("/work/repo/src/sitecustomize.py", "/work/.local/lib/python3.11/site-packages/usercustomize.py"):
        text_of(run(env.step(write(path, log))))
    text_of(run(env.step(Bash("python3 -c pass"))))  # the agent's own Python loads both
    text_of(run(env.step(Edit("view", "setup.cfg"))))  # a runner call: loads neither
    loaded_by = text_of(run(env.step(Bash("cat /work/loaded-by")))).split("stdout:\n")[1].split("\nstderr:")[0]
    assert loaded_by.split() == ["-c", "-c"]
    run(env.end_episode())


def test_the_fix_scores_with_other_changes_listed_but_not_applied(env, task):
    others = [
        Bash("mkdir notes && for i in $(seq 10 69); do echo $i > notes/$i.txt; done"),
        Bash(f"echo 'assert False' >> {task.test_files[0]}"),
    ]
    step = play(env, task, others + S.oracle_actions(task)[:-1])
    assert step.reward == 1.0 and step.outcome.status is EpisodeStatus.SUCCESS, step.outcome
    assert step.info["changes_outside_sources"] == [f"notes/{i}.txt" for i in range(10, 60)]  # the first 50
    assert step.info["changes_outside_sources_count"] == 61
    assert play(env, task, []).reward == 0.0  # the no-op
