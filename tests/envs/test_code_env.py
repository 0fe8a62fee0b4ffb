"""The code environment on real containers: every tool action, the judge on right and wrong
fixes, resource faults that quarantine, pooled and fresh resets; action parsing and
observation text as pure functions."""

import base64

import pytest

from cua_jax.environments.code_env import CodeEnvConfig, CodeEnvironment, bash_observation, escape_output, stream_text
from cua_jax.envs import actions as A
from cua_jax.envs.code_actions import Bash, Edit, Submit, parse_code_action, render_code_action
from cua_jax.envs.contract import EnvironmentFault
from cua_jax.envs.faults import FaultKind, episode_outcome
from cua_jax.rollout.agent_loop import AgentConfig
from cua_jax.tasks import code_suite as S
from cua_jax.types import EpisodeStatus
from tests.support.code_env import run, text_of

# ---- pure: actions and observations -------------------------------------------------------


@pytest.mark.parametrize(
    "action",
    [
        Bash("ls -la"),
        Bash("sleep 1", 2.5),
        Submit(),
        Edit("view", "a.py"),
        Edit("view", "a.py", view_range=(3, -1)),
        Edit("create", "pkg/new.py", file_text="x = 1\n"),
        Edit("str_replace", "a.py", old_str="a < b", new_str="a <= b"),
        Edit("insert", "a.py", insert_line=0, new_str="#"),
    ],
)
def test_actions_render_and_parse_back(action):
    assert parse_code_action("I will act.\n" + render_code_action(action)) == action


@pytest.mark.parametrize(
    "text, message",
    [
        ("no call at all", "no tool call found"),
        ('<tool_call>{"name": "bash"', "not valid JSON"),
        ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "unknown tool"),
        ('<tool_call>{"name": "bash", "arguments": {}}</tool_call>', "'command' is required"),
        ('<tool_call>{"name": "bash", "arguments": {"command": "ls", "timeout": -1}}</tool_call>', "'timeout'"),
        (
            '<tool_call>{"name": "str_replace_editor", "arguments": {"command": "delete", "path": "a"}}</tool_call>',
            "'command' must be one of",
        ),
        (
            '<tool_call>{"name": "str_replace_editor", '
            '"arguments": {"command": "str_replace", "path": "a", "old_str": ""}}</tool_call>',
            "'old_str' is empty",
        ),
        (
            '<tool_call>{"name": "submit", "arguments": {}}</tool_call><tool_call>{"name": "submit"}</tool_call>',
            "2 tool calls",
        ),
    ],
)
def test_malformed_actions_become_invalid_actions_with_a_reason(text, message):
    action = parse_code_action(text)
    assert isinstance(action, A.InvalidAction) and message in action.message


def test_binary_is_escaped_and_truncation_is_marked():
    assert escape_output(b"ok\n\ttab\x00\x1b[31m\xff\xfe") == "ok\n\ttab\\x00\\x1b[31m\\xff\\xfe"
    assert escape_output("héllo".encode()) == "héllo"
    assert stream_text(b"abc", b"xyz", 6) == "abcxyz"
    assert stream_text(b"abc", b"xyz", 1006) == "abc\n[... 1000 bytes truncated ...]\nxyz"
    result = {
        "exit_code": -9,
        "timed_out": True,
        "stdout": {"head": base64.b64encode(b"partial").decode(), "tail": "", "total": 7},
        "stderr": {"head": "", "tail": "", "total": 0},
    }
    assert bash_observation(result, 2.0).startswith("killed: the command ran past its timeout of 2 s")


# ---- real containers ----------------------------------------------------------------------


def test_bash_output_exit_code_truncation_binary_and_timeout(env, task):
    start = run(env.reset(task))
    assert task.instruction == start.instruction and "/work/repo" in start.observation.text
    text = text_of(run(env.step(Bash("ls; echo oops >&2; exit 3"))))
    assert text.startswith("exit code: 3") and "test_inflection.py" in text and "stderr:\noops" in text
    text = text_of(run(env.step(Bash("yes 0123456789 | head -c 100000"))))
    assert "[... 98000 bytes truncated ...]" in text and len(text) < 2300
    text = text_of(run(env.step(Bash(r"printf 'a\000b\033[0m\377'"))))
    assert "a\\x00b\\x1b[0m\\xff" in text
    text = text_of(run(env.step(Bash("sleep 600 & echo started; sleep 600", timeout=1))))
    assert text.startswith("killed: the command ran past its timeout of 1 s") and "started" in text
    # the timeout killed the command's whole session, its background job included
    assert "sleep" not in text_of(run(env.step(Bash("ps -eo comm"))))
    run(env.end_episode())


def test_editor_view_create_replace_insert_and_refusals(env, task):
    run(env.reset(task))
    assert "inflection/__init__.py" in text_of(run(env.step(Edit("view", "."))))
    text = text_of(run(env.step(Edit("view", "inflection/__init__.py", view_range=(12, 13)))))
    assert text.split("\n")[0].strip().startswith("12") and "lines 14-" in text
    assert "created" in text_of(run(env.step(Edit("create", "notes/todo.txt", file_text="one\ntwo\n"))))
    assert "edited" in text_of(run(env.step(Edit("str_replace", "notes/todo.txt", old_str="two", new_str="2"))))
    assert "inserted" in text_of(run(env.step(Edit("insert", "notes/todo.txt", insert_line=0, new_str="zero"))))
    assert text_of(run(env.step(Bash("cat notes/todo.txt")))).split("stdout:\n")[1].startswith("zero\none\n2\n")
    assert "occurs 0 times" in text_of(
        run(env.step(Edit("str_replace", "notes/todo.txt", old_str="three", new_str="")))
    )
    run(env.step(Edit("create", "notes/twice.txt", file_text="x x")))
    assert "occurs 2 times" in text_of(run(env.step(Edit("str_replace", "notes/twice.txt", old_str="x", new_str="y"))))
    assert "outside [0, 4]" in text_of(run(env.step(Edit("insert", "notes/todo.txt", insert_line=9, new_str="z"))))
    run(env.step(Bash("ln -s /etc etc_link")))
    for path in ("../outside.py", "/etc/passwd", "etc_link/passwd"):
        for action in (Edit("create", path, file_text="x"), Edit("view", path)):
            text = text_of(run(env.step(action)))
            assert "refused" in text and "outside the repository" in text
    invalid = parse_code_action('<tool_call>{"name": "bash", "arguments": {}}</tool_call>')
    assert text_of(run(env.step(invalid))).startswith("Invalid action:")
    run(env.end_episode())


def test_judge_right_fix_wrong_fix_and_test_tampering(env, task):
    run(env.reset(task))
    step = run(env.step(S.oracle_actions(task)[0]))
    step = run(env.step(Submit()))
    assert step.outcome.status is EpisodeStatus.SUCCESS and step.reward == 1.0
    assert step.info["fail_to_pass_passed"] == step.info["fail_to_pass_total"] >= 1
    assert step.info["changes_outside_sources"] == [] and step.info["changes_outside_sources_count"] == 0
    # no fix
    run(env.reset(task))
    step = run(env.step(Submit()))
    assert step.outcome.status is EpisodeStatus.FAILURE and step.reward == 0.0
    # the fix plus a regression elsewhere: still no reward, the broken test is named
    run(env.reset(task))
    run(env.step(S.oracle_actions(task)[0]))
    regression = Edit(
        "str_replace",
        "inflection/__init__.py",
        old_str="def dasherize(word: str) -> str:\n",
        new_str="def dasherize(word: str) -> str:\n    return word\n",
    )
    assert "edited" in text_of(run(env.step(regression)))
    step = run(env.step(Submit()))
    assert step.reward == 0.0 and any("dasherize" in t for t in step.info["broken"])
    # editing the tests instead of the code: the judge runs the clean tests, and names the edit
    run(env.reset(task))
    run(env.step(Bash("printf 'def test_nothing():\\n    pass\\n' > test_inflection.py")))
    step = run(env.step(Submit()))
    assert step.reward == 0.0 and step.info["changes_outside_sources"] == ["test_inflection.py"]
    # a "fix" that makes the tests hang: killed at the task's timeout, scored as a failure
    import dataclasses

    run(env.reset(dataclasses.replace(task, timeout=3.0)))
    run(env.step(Edit("insert", "inflection/__init__.py", insert_line=0, new_str="import time; time.sleep(600)")))
    step = run(env.step(Submit()))
    assert step.outcome.status is EpisodeStatus.FAILURE and "ran past 3.0s" in step.outcome.reason


def test_the_turn_budget_ends_the_episode_without_verdict(task):
    env = CodeEnvironment(CodeEnvConfig(max_turns=2))
    try:
        run(env.reset(task))
        run(env.step(Bash("true")))
        step = run(env.step(Bash("true")))
        assert step.outcome.status is EpisodeStatus.NO_VERDICT
    finally:
        run(env.close())


@pytest.mark.parametrize(
    "command, kind, detail",
    [
        ("python3 -c 'import os\nwhile True: os.fork()'", FaultKind.PROCESS_LIMIT, "pids limit"),
        ("python3 -c 'x = []\nwhile True: x.append(bytearray(10**7))'", FaultKind.OOM_KILLED, "memory limit"),
        ("dd if=/dev/zero of=big bs=1M count=200", FaultKind.WORK_TREE_FULL, "size-capped tmpfs"),
    ],
)
def test_resource_faults_end_the_episode_and_the_next_episode_is_clean(env, task, command, kind, detail):
    run(env.reset(task))
    started = env.counters["containers_started"]
    step = run(env.step(Bash(command, timeout=60)))
    assert step.outcome.status is EpisodeStatus.QUARANTINED  # the environment's own view: a fault
    assert step.fault.kind is kind and detail in step.fault.detail
    # The agent's command caused it: under the experiments' default rule it is the agent's failure.
    from experiments.configs.base import base_config

    rule = AgentConfig(agent_faults=tuple(base_config().advantage.agent_faults)).attribution
    assert episode_outcome(fault=step.fault, rule=rule).status is EpisodeStatus.FAILURE
    run(env.end_episode())
    run(env.reset(task))  # a new container replaced the broken one
    assert env.counters["containers_started"] == started + 1
    text = text_of(run(env.step(Bash("ls; ps -eo comm | grep -c python3; df --output=avail /work | tail -1"))))
    assert "big" not in text and "test_inflection.py" in text
    run(env.end_episode())


def test_pooled_reset_cleans_the_tree_in_the_same_container(env, task):
    run(env.reset(task))
    started = env.counters["containers_started"]
    run(env.step(Bash("echo junk > junk.txt; echo tmp > /tmp/t; (setsid sleep 900 &) ; rm -rf inflection")))
    run(env.reset(task))
    text = text_of(run(env.step(Bash("ls; ls /tmp; ps -eo comm"))))
    assert "junk.txt" not in text and "inflection\n" in text and "sleep" not in text and "\nt\n" not in text
    assert env.counters["containers_started"] == started
    run(env.end_episode())


def test_fresh_mode_starts_a_container_per_episode(task):
    env = CodeEnvironment(CodeEnvConfig(reset_mode="fresh"))
    try:
        ids = []
        for _ in range(2):
            run(env.reset(task))
            ids.append(env.container.id)
            run(env.end_episode())
            assert env.container is None
        assert ids[0] != ids[1] and env.counters["containers_started"] == 2
    finally:
        run(env.close())


def test_a_task_the_image_lacks_is_a_setup_fault(env, task):
    import dataclasses

    missing = dataclasses.replace(task, package="no-such-package")
    with pytest.raises(EnvironmentFault) as error:
        run(env.reset(missing))
    assert error.value.fault.kind is FaultKind.SETUP_FAILED and "no-such-package" in error.value.fault.detail
    with pytest.raises(ValueError, match="CodeTask"):
        run(env.reset("not a task"))
