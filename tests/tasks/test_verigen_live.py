"""VeriGen against the real desktop pool (dockerd + the desktop image).

The programmatic loop accepts tasks that re-run from scratch (0 untouched, 1 solved);
the LLM path runs end to end against a loopback replay server — a STAND-IN for the
model that replays recorded chat responses, not a model — including malformed output;
the probe grants sessions first come, first served; composed and sub-tasks from
trajectory-guided synthesis pass the dry run.
"""

import json
import os
import threading
import time

import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.docker_pool import LABEL_POOL, DockerEnvPool, PoolConfig
from cua_jax.envs.images import ensure_image
from cua_jax.observe.episode_log import EpisodeRecord, pass_rates
from cua_jax.tasks.verigen import llm, pipeline, templates, trajectory
from cua_jax.tasks.verigen.knowledge import DESKTOP_KNOWLEDGE
from cua_jax.tasks.verigen.probe import InteractionProbe
from cua_jax.tasks.verigen.replay_server import ReplayServer
from cua_jax.tasks.verigen.roles import ProgrammaticJudger, ScriptedChecker, TemplateFixer
from cua_jax.types import Episode, EpisodeStatus, Turn

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def probe():
    with DockerEnvPool(
        PoolConfig(image=ensure_image("desktop"), size=3, cpus=1.0, memory="1g", health_interval=None)
    ) as pool:
        with InteractionProbe(pool) as probe:
            yield probe
    assert pool.docker.api.containers(all=True, filters={"label": f"{LABEL_POOL}={pool.pool_id}"}) == []


def test_programmatic_loop_accepts_tasks_that_rerun_from_scratch(probe, tmp_path):
    # a third of the candidates carry a proposer defect: the static roles and the fixer handle them
    # (the GUI families are exercised by the synthesis run; the fast ones keep this test short)
    proposer = templates.TemplateProposer(
        seed=11, defect_rate=0.5, families=("file_create", "file_append", "file_replace", "term_tree")
    )
    checker = ScriptedChecker(probe, judge_timeout_cap=5.0)
    verigen = pipeline.VeriGen(proposer, ProgrammaticJudger(), checker, TemplateFixer(), pipeline.LoopConfig())
    report = verigen.run(target=6, max_candidates=6, workers=2)
    summary = report.summary()
    assert summary["accepted"] == 6, summary
    assert summary["rejected_by"] == {}, [r.reason for r in report.results if not r.accepted]
    assert summary["repaired"] >= 1  # some defect got repaired rather than rejected
    pipeline.write_tasks(report.accepted, tmp_path)
    again = pipeline.read_tasks(tmp_path)
    assert sorted(c.id for c in again) == sorted(c.id for c in report.accepted)
    record = json.loads((tmp_path / "tasks" / f"{again[0].id}.json").read_text())["validation"]
    assert record["rule_pass"] and record["judger_pass"] and record["execution_pass"]
    assert (tmp_path / "judges" / f"{again[0].id}.py").read_text() == again[0].judge_code
    for candidate in again:  # from scratch: a fresh environment per task
        verdict = checker.check(candidate)
        assert verdict.passed, (candidate.id, verdict.reasons)
        assert (verdict.detail["initial_score"], verdict.detail["final_score"]) == (0.0, 1.0)
        for path in candidate.metadata["stated"]:  # what the judge read exists only in the environment
            assert not (str(path).startswith("/root/") and os.path.exists(path))


def _proposal(task_id, path, content, code=None, instruction=None, timeout=5):
    entry = "check_" + task_id.replace("-", "_")
    code = code or (
        f"import os\n\ndef {entry}():\n    if not os.path.isfile({path!r}):\n        return 0.0\n"
        f"    with open({path!r}) as handle:\n        return 1.0 if handle.read().strip() == {content!r} else 0.0\n"
    )
    return json.dumps(
        {
            "id": task_id,
            "instruction": instruction or f"Create the file {path} whose only line is: {content}",
            "config": [{"type": "execute", "parameters": {"command": ["mkdir", "-p", "/root/llm"]}}],
            "judge_code": code.replace("ENTRY", entry),
            "judge_entry": entry,
            "judge_timeout": timeout,
            "solution": [{"action": "write_file", "path": path, "content": content + "\n"}, {"action": "done"}],
            "app": "files",
            "difficulty": "easy",
            "estimated_steps": 2,
            "stated": [path, content],
        }
    )


def _actions(path, content):
    return json.dumps({"actions": [{"action": "write_file", "path": path, "content": content + "\n"}]})


PASS = json.dumps({"pass": True, "score": 0.9, "reasons": []})
RAISES = "def ENTRY():\n    return 1.0 / 0\n"
LOOPS = "def ENTRY():\n    return float(sum(range(10 ** 13)) < 0)\n"  # passes the rules, never ends in time
WHILE = "def ENTRY():\n    while True:\n        pass\n"


def test_llm_path_end_to_end_with_a_replayed_model_stand_in(probe):
    g, r, lo, w, a = (
        "/root/llm/good.txt",
        "/root/llm/raises.txt",
        "/root/llm/loops.txt",
        "/root/llm/while.txt",
        "/root/llm/vague.txt",
    )
    recording = [
        # call 1: a good task; prose with no JSON; a judge that raises (fixed on the first round)
        {"role": "proposer", "match": "slot 0 of 3", "content": "Here you go:\n" + _proposal("llm-good", g, "good 1")},
        {"role": "proposer", "match": "slot 1 of 3", "content": "Sorry, I cannot think of a task right now."},
        {"role": "proposer", "match": "slot 2 of 3", "content": _proposal("llm-raises", r, "raises 2", RAISES)},
        # call 2: a judge that never ends; a while-loop judge whose fix is prose; a vague instruction
        {"role": "proposer", "match": "slot 0 of 3", "content": _proposal("llm-loops", lo, "loops 3", LOOPS)},
        {"role": "proposer", "match": "slot 1 of 3", "content": _proposal("llm-while", w, "while 4", WHILE)},
        {
            "role": "proposer",
            "match": "slot 2 of 3",
            "content": _proposal("llm-vague", a, "vague 5", instruction="Make a file with the right text in it."),
        },
        {"role": "judger", "match": "Task llm-good", "content": PASS},
        {"role": "checker", "match": "Task llm-good", "content": _actions(g, "good 1")},
        {"role": "judger", "match": "Task llm-raises", "content": PASS},
        {"role": "judger", "match": "Task llm-raises", "content": PASS},
        {"role": "checker", "match": "Task llm-raises", "content": _actions(r, "raises 2")},  # after the fix
        {"role": "fixer", "match": "Task llm-raises", "content": _proposal("llm-raises", r, "raises 2")},
        {"role": "judger", "match": "Task llm-loops", "content": PASS},
        {"role": "judger", "match": "Task llm-loops", "content": PASS},
        {"role": "fixer", "match": "Task llm-loops", "content": _proposal("llm-loops", lo, "loops 3", LOOPS)},
        {"role": "fixer", "match": "Task llm-while", "content": "I fixed it, the loop is fine now."},
        {
            "role": "judger",
            "match": "Task llm-vague",
            "content": json.dumps(
                {"pass": False, "score": 0.2, "reasons": ["the instruction does not say which file or what text"]}
            ),
        },
        {"role": "fixer", "match": "Task llm-vague", "content": _proposal("llm-vague", a, "vague 5")},
        {"role": "judger", "match": "Task llm-vague", "content": PASS},
        {"role": "checker", "match": "Task llm-vague", "content": _actions(a, "vague 5")},
    ]
    with ReplayServer(recording) as server:
        chat = llm.ChatClient(
            server.base_url,
            model="replay",
            timeout=30.0,
            retries=1,
            backoff=0.1,
            price_prompt=1.0,
            price_completion=2.0,
        )
        verigen = pipeline.VeriGen(
            llm.LLMProposer(chat),
            llm.LLMJudger(chat),
            llm.LLMChecker(probe, chat, judge_timeout_cap=3.0),
            llm.LLMFixer(chat),
            pipeline.LoopConfig(max_fix_rounds=1),
            knowledge=DESKTOP_KNOWLEDGE,
            cost=chat.ledger.cost,
            observe=probe.observe_fresh,
        )
        report = verigen.run(target=100, max_candidates=6, workers=1)
        assert server.unused() == [], [server.entries[i] for i in server.unused()]
        proposals = [r["user"] for r in server.requests if r["role"] == "proposer"]
        assert all("gnumeric" in p and "<desktop-frame" in p for p in proposals)  # knowledge + probe observation
    by_id = {r.candidate.id: r for r in report.results if r.candidate}
    assert sorted(r.candidate.id for r in report.results if r.accepted) == ["llm-good", "llm-raises", "llm-vague"]
    assert [r.reason for r in report.results if r.candidate is None] == [
        "proposer: the proposer reply holds no JSON object: 'Sorry, I cannot think of a task right now.'"
    ]
    raised = by_id["llm-raises"].candidate
    assert "ZeroDivisionError" in raised.history[2].reasons[0] and len(raised.repairs) == 1
    assert raised.validation_record()["execution_pass"] and raised.validation_record()["repair_history"]
    assert by_id["llm-loops"].rejected_by == "checker" and "timed out" in by_id["llm-loops"].reason
    assert by_id["llm-while"].rejected_by == "fixer" and "no JSON object" in by_id["llm-while"].reason
    assert "while loop" in by_id["llm-while"].candidate.history[0].reasons[0]
    assert by_id["llm-vague"].candidate.repairs and by_id["llm-vague"].candidate.history[1].role == "judger"
    ledger = chat.ledger.summary()
    assert ledger["calls"] == len(recording) and ledger["cost_usd"] > 0 and report.cost_usd == ledger["cost_usd"]


def test_exhausted_model_stand_in_is_an_error_not_a_hang(probe):
    with ReplayServer([]) as server:
        chat = llm.ChatClient(server.base_url, model="replay", timeout=5.0, retries=2)
        results = llm.LLMProposer(chat).propose(2)
    assert all(isinstance(r, pipeline.ProposalError) and "no recorded response" in str(r) for r in results)
    assert [c.attempts for c in chat.ledger.calls] == [1, 1]  # a 4xx is not retried


def test_probe_grants_sessions_in_arrival_order(probe):
    served = []
    lock = threading.Lock()
    hold = threading.Event()

    def holder():
        with probe.session():
            hold.wait(60)

    holders = [threading.Thread(target=holder) for _ in range(3)]  # occupy the whole pool
    for thread in holders:
        thread.start()

    def worker(index):
        with probe.session() as session:
            session.observe()  # screenshot and accessibility text through the probe
            with lock:
                served.append(index)

    waiters = []
    while probe.queue_length() > 0:  # the holders are served first
        time.sleep(0.05)
    for index in range(5):
        thread = threading.Thread(target=worker, args=(index,))
        thread.start()
        waiters.append(thread)
        while probe.queue_length() < index + 1:  # index is queued before the next arrives
            time.sleep(0.01)
    hold.set()
    for thread in holders + waiters:
        thread.join(300)
    assert sorted(served) == list(range(5))
    # each grant went to the longest-waiting worker: arrival times in grant order are increasing
    assert len(probe.grants) >= 8 and probe.grants[-5:] == sorted(probe.grants[-5:])


def test_trajectory_guided_tasks_pass_the_dry_run(probe):
    a = templates.render("file_create", {"dir": "/root/notes", "name": "maple_onyx.txt", "content": "quartz 42"})
    b = templates.render(
        "file_append", {"path": "/root/projects/raven.txt", "lines": ["amber = 1", "basil = 2"], "new": "cedar = 300"}
    )
    composed = trajectory.compose(a, b)
    checker = ScriptedChecker(probe, judge_timeout_cap=5.0)
    assert checker.check(composed).passed
    # an agent that did the first goal, then wrote the wrong line: it departs at the second goal
    wrong = A.render_action(A.WriteFile("/root/projects/raven.txt", "amber = 1\nbasil = 2\ncedar = 3\n"))
    steps = [composed.solution[0], wrong, A.render_action(A.Done())]
    failed = EpisodeRecord.from_episode(
        0,
        Episode(
            "e1",
            composed.id,
            0,
            composed.instruction,
            [Turn("", [], None, None, response_text=s) for s in steps],
            status=EpisodeStatus.FAILURE,
        ),
    )
    subs = trajectory.subtasks_from_failures([failed], {composed.id: composed}, pass_rates([failed]))
    assert [s.instruction for s in subs] == [b.instruction]
    verdict = checker.check(subs[0])  # its setup replays the first goal's steps
    assert verdict.passed, verdict.reasons
