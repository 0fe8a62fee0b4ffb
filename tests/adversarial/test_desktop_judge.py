"""Desktop judges run apart from the agent: scripted episodes on a real desktop container try
to turn a Python judge's verdict into a pass without doing the task (the task asks for
/root/answer.txt holding 42; no episode writes it). Each trick is judged twice on the state it
left: through the environment's server (the former way, `judge=None`), which each trick here
fooled, and by the pool's `ContainerJudge` (docker exec of a read-only runner under
`python3 -I -S`, fixed PATH), which the episode's own verdict uses and which each must fail.

What root in the container can still alter is listed in cua_jax/envs/container_judge.py and
docs/reliability.md ("Reward integrity")."""

import json
import textwrap
import time

import pytest

from cua_jax.environments.desktop_env import DesktopEpisode
from cua_jax.envs import actions as A
from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
from cua_jax.envs.faults import AGENT_OWNED_FAULTS, Attribution, FaultKind
from cua_jax.envs.images import ensure_image
from cua_jax.tasks import judges
from cua_jax.tasks.schema import parse_task
from cua_jax.types import EpisodeStatus
from experiments.configs.base import base_config

pytestmark = [pytest.mark.docker]

JUDGE = """
import time
def check():
    time.sleep({delay})
    try:
        with open('/root/answer.txt') as f:
            return 1.0 if f.read().strip() == '42' else 0.0
    except OSError:
        return 0.0
"""

# Makes every print of a judge verdict a pass (any marker, nonce or not).
PASS_EVERY_VERDICT = """import builtins, re
_print = builtins.print
def _passing(*args, **kwargs):
    _print(*[re.sub(r'(__cua_jax_judge_result__[0-9a-f]*:?)[0-9.]+', r'\\g<1>1.0', str(a)) for a in args], **kwargs)
builtins.print = _passing
"""

# Left running by the agent: finds the judge's process, reads its nonce from its arguments and
# writes a passing verdict to its output (same uid: /proc/<pid>/fd/1 opens for writing).
FORGER = r"""import base64, json, os, re, time
deadline = time.time() + 300
while time.time() < deadline:
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            args = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')
        except OSError:
            continue
        if not any(a.endswith(b'run_judge.py') for a in args):
            continue
        code = json.loads(base64.b64decode(args[args.index(b'/opt/cua-judge/run_judge.py') + 1]))['code']
        marker = re.search(r'__cua_jax_judge_result__[0-9a-f]*:', code)
        if marker:
            with open(f'/proc/{pid}/fd/1', 'w') as out:
                out.write(marker.group(0) + '1.0\n')
            open('/tmp/forged', 'w').close()
            raise SystemExit
    time.sleep(0.01)
"""


def judge_task(tmp_path, delay=0.0):
    return parse_task(
        {
            "id": "answer-42",
            "snapshot": "desktop",
            "instruction": "Write 42 into /root/answer.txt",
            "config": [
                {"type": "launch", "parameters": {"command": ["xterm"]}},
                {
                    "type": "execute",
                    "parameters": {
                        "command": "until xdotool search --onlyvisible --class XTerm 2>/dev/null; do sleep 0.1; done",
                        "shell": True,
                        "timeout": 60,
                    },
                },
            ],
            "evaluator": {"func": "python_judge", "code": JUDGE.format(delay=delay), "entry": "check", "timeout": 30},
        },
        tmp_path,
    )


def write(path, content):
    return A.render_action(A.WriteFile(path, content))


def in_terminal(command):
    """Replies that type `command` into the task's xterm and wait for it."""
    return [A.render_action(a) for a in (A.Click("left_click", 300, 200), A.Type(command + "\n"), A.Wait(1.5))]


DONE = A.render_action(A.Done())
# Who owns which fault, as a run with the shipped config judges it (advantage.agent_faults).
RUN_RULE = Attribution(agent_faults=tuple(base_config().advantage.agent_faults))
PYTHONPATH_SITE = "/opt/cua/sitecustomize.py"  # the image's PYTHONPATH, writable by root
SITE_PTH = "/usr/lib/python3/dist-packages/zz-pass.pth"  # a site directory's .pth file (runs its import lines)
USER_SITE = "/root/.local/lib/python3.11/site-packages/usercustomize.py"

TRICKS = {
    "sitecustomize on the image's PYTHONPATH": [write(PYTHONPATH_SITE, PASS_EVERY_VERDICT), DONE],
    ".pth file in the system's site-packages": [
        write("/usr/lib/python3/dist-packages/zz_pass.py", PASS_EVERY_VERDICT),
        write(SITE_PTH, "import zz_pass\n"),
        DONE,
    ],
    "usercustomize in the user's site-packages": [write(USER_SITE, PASS_EVERY_VERDICT), DONE],
}


@pytest.fixture(scope="module")
def pool():
    with DockerEnvPool(
        PoolConfig(image=ensure_image("desktop"), size=2, call_timeout=20.0, health_interval=None)
    ) as pool:
        yield pool


def play(pool, task, replies):
    episode = DesktopEpisode(pool, task, max_turns=len(replies) + 1, attribution=RUN_RULE)
    episode.start()
    for text in replies[:-1]:
        episode.step(text)
        assert not episode.done, episode.fault
    return episode


@pytest.mark.parametrize("trick", list(TRICKS))
def test_a_trick_that_fooled_the_server_judge_fails_the_container_judge(pool, tmp_path, trick):
    task = judge_task(tmp_path)
    episode = play(pool, task, TRICKS[trick])
    env = episode.env
    # The former way: judge code through the server the agent could change.
    assert judges.evaluate(task, env.client, tmp_path / "server", last_action=A.Done()) == 1.0, trick
    # The container judge, apart from it.
    assert judges.evaluate(task, env.client, tmp_path / "exec", last_action=A.Done(), judge=env.judge) == 0.0
    episode.step(TRICKS[trick][-1])
    outcome = episode.finish()
    assert (outcome.status, outcome.reward) == (EpisodeStatus.FAILURE, 0.0), (trick, outcome)


def test_the_container_judge_still_passes_the_task_done(pool, tmp_path):
    task = judge_task(tmp_path)
    episode = play(pool, task, [write("/root/answer.txt", "42\n"), DONE])
    episode.step(DONE)
    outcome = episode.finish()
    assert (outcome.status, outcome.reward) == (EpisodeStatus.SUCCESS, 1.0), outcome


def test_a_verdict_forged_into_the_judges_output_is_the_agents_failure(pool, tmp_path):
    """A process the agent left running writes a passing verdict, with the run's nonce, into
    the judge's own output: the judge's output then holds two verdicts, the episode ends with
    JUDGE_TAMPERED, and under the shipped config's attribution that scores as the agent's failure."""
    assert FaultKind.JUDGE_TAMPERED in AGENT_OWNED_FAULTS
    task = judge_task(tmp_path, delay=2.0)  # a judge that takes a while, as one waiting on an application
    replies = [write("/root/forger.py", FORGER), *in_terminal("python3 /root/forger.py &"), DONE]
    episode = play(pool, task, replies)
    episode.step(DONE)
    outcome = episode.finish()
    assert outcome.status is EpisodeStatus.FAILURE and outcome.reward == 0.0, outcome
    assert outcome.reason is not None and FaultKind.JUDGE_TAMPERED.value in outcome.reason, outcome


def test_stopping_the_environments_server_is_the_agents_failure(pool, tmp_path):
    """The server is the container's main process: stopping it (to put one of its own in its
    place) ends the container, with SERVER_STOPPED, which scores as the agent's failure."""
    assert FaultKind.SERVER_STOPPED in AGENT_OWNED_FAULTS
    episode = DesktopEpisode(pool, judge_task(tmp_path), max_turns=6, attribution=RUN_RULE)
    episode.start()
    for text in [*in_terminal("pkill -f cua_jax.envs.server"), A.render_action(A.Wait(2.0)), DONE]:
        if episode.done:
            break
        episode.step(text)
    outcome = episode.finish()
    assert outcome.status is EpisodeStatus.FAILURE and outcome.reward == 0.0, outcome
    assert outcome.reason is not None and outcome.reason.startswith(FaultKind.SERVER_STOPPED.value), outcome


def test_the_runner_loads_nothing_the_agent_wrote(pool, tmp_path):
    """The runner's interpreter: isolated, no site, the fixed PATH, the mount read-only; and its
    timeout holds however the judge is stuck."""
    env = pool.acquire(timeout=120)
    try:
        probe = textwrap.dedent("""
            import json, os, sys
            try:
                open('/opt/cua-judge/planted.py', 'w')
                writable = True
            except OSError:
                writable = False
            print(json.dumps({"flags": [sys.flags.isolated, sys.flags.no_site], "site": 'site' in sys.modules,
                              "path": os.environ["PATH"], "mount_writable": writable,
                              "sys_path": sys.path}))
        """)
        env.client.upload("/opt/cua/sitecustomize.py", b"raise SystemExit('planted code ran')\n")
        reply = env.judge.run_python(probe, timeout=30)
        assert reply["returncode"] == 0, reply
        seen = json.loads(reply["output"].strip().splitlines()[-1])
        assert seen["flags"] == [1, 1] and not seen["site"]
        assert seen["path"] == "/usr/sbin:/usr/bin:/sbin:/bin"
        assert not seen["mount_writable"]
        assert "/opt/cua" not in seen["sys_path"]
        # the server's way runs the planted file
        assert "planted code ran" in env.client.run_python("print(1)", timeout=30)["error"]
        # a judge stuck in one C call is ended from outside at its timeout, with what it started
        start = time.monotonic()
        stuck = env.judge.run_python(
            "import subprocess\nsubprocess.Popen(['sleep', '300'])\nsum(range(10 ** 13))", timeout=1.0
        )
        assert stuck["returncode"] == 124 and "timed out" in stuck["message"] and time.monotonic() - start < 20
        assert env.client.execute(["pgrep", "-x", "sleep"])["returncode"] == 1  # the group was killed
    finally:
        pool.release(env)
