"""Training feeds synthesis: the run's episode log, its pass rates, and trajectory-guided
synthesis from a run's real episodes (sub-tasks of failed tasks, composition of solved ones).

The last test drives `python -m experiments.synthesize` from a run's workdir on the real
desktop pool (docker, slow)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from cua_jax.envs import actions as A
from cua_jax.observe.episode_log import EPISODE_LOG, EpisodeLog, EpisodeRecord, pass_rates, read_episode_log
from cua_jax.tasks.verigen import pipeline, rules, templates, trajectory
from cua_jax.types import Episode, EpisodeStatus, Fault, FaultKind, Turn

S, F, N, Q = EpisodeStatus.SUCCESS, EpisodeStatus.FAILURE, EpisodeStatus.NO_VERDICT, EpisodeStatus.QUARANTINED
REPO = pathlib.Path(__file__).resolve().parents[2]


def episode(task_id, status, replies=(), index=0, reward=None):
    turns = [
        Turn(
            f"screen {i}",
            [np.zeros((2, 2, 3), np.uint8)],
            np.arange(3, dtype=np.int32),
            np.zeros(3, np.float32),
            response_text=r,
        )
        for i, r in enumerate(replies)
    ]
    return Episode(
        f"{task_id}-{index}",
        task_id,
        index // 4,
        f"do {task_id}",
        turns,
        reward=float(status is S) if reward is None else reward,
        status=status,
        fault=Fault(FaultKind.CONTAINER_EXITED, "died") if status is Q else None,
        policy_version=index,
    )


def record(task_id, status, replies=(), step=0):
    return EpisodeRecord.from_episode(step, episode(task_id, status, replies))


def said(thought, text):
    """An agent reply: free reasoning before the tool call (the policy's own wording)."""
    return f"{thought}\n{text}"


# ---- the episode log ------------------------------------------------------------------


def test_episode_log_round_trips_and_pass_rates_match_numpy(tmp_path):
    rng = np.random.default_rng(0)
    tasks = ["t0", "t1", "t2", "t3"]
    statuses = [S, F, N, Q]
    drawn = [(tasks[rng.integers(3)], statuses[rng.integers(4)]) for _ in range(60)] + [("t3", Q), ("t3", Q)]
    episodes = [
        episode(t, s, [f"reply {i} of {t}", "<tool_call>{}"], i, reward=0.5 * i) for i, (t, s) in enumerate(drawn)
    ]
    path = tmp_path / "run" / EPISODE_LOG
    EpisodeLog(path).append(0, episodes[:30], {"t0": "files", "t1": "terminal"})
    EpisodeLog(path).append(1, episodes[30:], {"t0": "files", "t1": "terminal"})  # a log made per step appends

    records = read_episode_log(path)
    assert [r.episode_id for r in records] == [e.episode_id for e in episodes]
    assert [r.step for r in records] == [0] * 30 + [1] * (len(episodes) - 30)
    first = records[7]
    assert first == EpisodeRecord(
        0,
        episodes[7].episode_id,
        episodes[7].task_id,
        {"t0": "files", "t1": "terminal"}.get(episodes[7].task_id, ""),
        episodes[7].group_id,
        episodes[7].status,
        3.5,
        7,
        episodes[7].quarantine_reason,
        episodes[7].instruction,
        (f"reply 7 of {episodes[7].task_id}", "<tool_call>{}"),
    )
    line = json.loads(path.read_text().splitlines()[7])
    assert sorted(line) == sorted(
        [
            "step",
            "episode_id",
            "task_id",
            "domain",
            "group_id",
            "status",
            "reward",
            "policy_version",
            "quarantine_reason",
            "instruction",
            "replies",
        ]
    )
    assert line["status"] == episodes[7].status.value

    ids = np.array([t for t, _ in drawn])
    status = np.array([s.value for _, s in drawn])
    kept = status != Q.value
    expected = {t: float(np.mean(status[kept & (ids == t)] == S.value)) for t in np.unique(ids[kept])}
    assert pass_rates(records) == pytest.approx(expected)
    assert "t3" not in pass_rates(records)  # only quarantined episodes

    EpisodeLog(path).drop_steps_from(1)  # a run resumed at step 1 logs step 1 again
    assert [r.step for r in read_episode_log(path)] == [0] * 30


@pytest.mark.parametrize(
    "line, problem",
    [
        ("{not json", "malformed episode record"),
        ('["a list"]', "expected a JSON object"),
        ('{"step": 1}', "missing fields"),
        ("STATUS", "status must be one of"),
        ("REPLIES", "replies must be a list of strings"),
        ("STEP", "step must be an integer"),
    ],
)
def test_malformed_line_names_the_file_and_line(tmp_path, line, problem):
    path = tmp_path / EPISODE_LOG
    EpisodeLog(path).append(3, [episode("t0", S, ["ok"])], {})
    good = path.read_text()
    value = json.loads(good)
    line = {
        "STATUS": json.dumps({**value, "status": "won"}),
        "REPLIES": json.dumps({**value, "replies": "ok"}),
        "STEP": json.dumps({**value, "step": True}),
    }.get(line, line)
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(ValueError, match=problem) as error:
        read_episode_log(path)
    assert f"{path}:3:" in str(error.value)


# ---- trajectory-guided synthesis from a run -------------------------------------------


def alike(texts):
    """A stand-in embedding under which all instructions are alike (one cluster per application)."""
    return np.ones((len(texts), 4), np.float32) / 2


def run_tasks(tmp_path):
    """A tiny task folder as VeriGen writes it: a multi-step editor task and three file tasks."""
    editor = templates.render(
        "editor_line",
        {
            "path": "/root/ledger.txt",
            "lines": ["amber = 1", "basil = 2", "cedar = 3", "dill = 4"],
            "line": 2,
            "value": 40,
        },
    )
    files = [
        templates.render("file_create", {"dir": f"/root/{d}", "name": f"{d}_note.txt", "content": f"{d} 7"})
        for d in ("alpha", "beta", "gamma")
    ]
    pipeline.write_tasks([editor] + files, tmp_path / "verigen")
    return editor, files


def test_from_run_splits_failed_tasks_at_the_real_deviation_and_composes_with_real_pass_rates(tmp_path):
    editor, (solved, mostly, half) = run_tasks(tmp_path)
    tasks = pipeline.read_task_dirs([tmp_path / "verigen"])
    assert sorted(tasks) == sorted(c.id for c in (editor, solved, mostly, half))
    assert tasks[editor.id].solution == editor.solution and tasks[editor.id].parts == editor.parts

    # the editor task failed every time: twice off course after the same two correct moves
    # (written in the agent's own words), once from the start; a quarantined episode has no say
    top, down = editor.solution[:2]
    wrong = A.render_action(A.Type("amber = 40"))
    off_at_2 = [said("Go to the top.", top), said("Line 2 is next.", down), wrong, A.render_action(A.Done())]
    off_at_2b = [said("Top first.", top), down, said("Type it.", wrong)]
    off_at_0 = [wrong, A.render_action(A.Done())]
    write = A.render_action(A.WriteFile("/root/elsewhere.txt", "x\n"))
    records = (
        [
            record(editor.id, F, off_at_2),
            record(editor.id, N, off_at_2b),
            record(editor.id, F, off_at_0),
            record(editor.id, Q),
        ]
        + [record(solved.id, S, solved.solution, step) for step in range(4)]
        + [record(mostly.id, S, mostly.solution)] * 3
        + [record(mostly.id, F, [write]), record(mostly.id, Q)]
        + [record(half.id, S, half.solution), record(half.id, F, [write])]
        + [record("task-of-another-suite", S, ["done"])]
    )

    made = trajectory.from_run(records, tasks, alike, max_pass_rate=0.5, min_pass_rate=0.7)
    assert made.pass_rates == {
        editor.id: 0.0,
        solved.id: 1.0,
        mostly.id: 0.75,
        half.id: 0.5,
        "task-of-another-suite": 1.0,
    }
    assert made.unknown_tasks == ["task-of-another-suite"]

    # one sub-task: the editor task from its real deviation on, set up by the agent's own replies
    assert len(made.subtasks) == 1, trajectory.describe(made.subtasks)
    sub = made.subtasks[0]
    assert sub.metadata["parent"] == editor.id and sub.metadata["deviation_step"] == 2
    assert sub.setup_actions == off_at_2[:2] != editor.solution[:2]  # the first episode deviating there
    assert sub.solution == editor.solution[2:] and sub.judge_entry == editor.judge_entry
    assert rules.validate(sub).passed, rules.validate(sub).reasons

    # composed: exactly the tasks whose real pass rate reaches 0.7 (not `half`, at 0.5)
    assert [sorted(c.metadata["parents"]) for c in made.composed] == [sorted([solved.id, mostly.id])]
    assert rules.validate(made.composed[0]).passed
    stricter = trajectory.from_run(records, tasks, alike, max_pass_rate=0.5, min_pass_rate=0.8)
    assert stricter.composed == []  # `mostly` (0.75) is not solved at 0.8: `solved` has no partner
    capped = trajectory.from_run(records, tasks, alike, max_subtasks=0, max_composed=0)
    assert capped.subtasks == [] and capped.composed == []

    with pytest.raises(ValueError, match="none of the 1 tasks of the episode log"):
        trajectory.from_run([record("unknown", F, [wrong])], tasks, alike)
    with pytest.raises(ValueError, match="max_pass_rate < min_pass_rate"):
        trajectory.from_run(records, tasks, alike, max_pass_rate=0.8, min_pass_rate=0.8)


def two_goals():
    """(a, b, the task doing a then b): two file goals and their composition."""
    a = templates.render("file_create", {"dir": "/root/notes", "name": "maple_onyx.txt", "content": "quartz 42"})
    b = templates.render(
        "file_append", {"path": "/root/projects/raven.txt", "lines": ["amber = 1", "basil = 2"], "new": "cedar = 300"}
    )
    return a, b, trajectory.compose(a, b)


WRONG_APPEND = A.render_action(A.WriteFile("/root/projects/raven.txt", "amber = 1\nbasil = 2\ncedar = 3\n"))


def test_a_successful_episode_is_the_reference_when_there_is_one():
    a, b, composed = two_goals()
    look, done, wrong = A.render_action(A.Screenshot()), A.render_action(A.Done()), WRONG_APPEND
    first, second = composed.solution[0], composed.solution[1]
    records = [
        record(composed.id, S, composed.solution),
        record(composed.id, S, [look, first, second, done]),  # another way to success: look first
        record(composed.id, F, [said("The note first.", first), wrong, done]),  # off the first path at step 1
        record(composed.id, F, [look, first, wrong, done]),  # off the second path at 2, not on the reference's
        record(composed.id, F, [wrong, done]),
    ]
    rates = pass_rates(records)
    subs = trajectory.subtasks_from_failures(records, {composed.id: composed}, rates)
    assert rates[composed.id] == pytest.approx(0.4)
    # the second goal alone, after a replay of the agent's first step; and the first goal alone
    assert [(s.instruction, s.setup_actions) for s in subs] == [
        (b.instruction, [records[2].replies[0]]),
        (a.instruction, []),
    ]
    assert subs[0].metadata["stated"] == b.metadata["stated"]  # the first goal's values are not this task's
    assert all(rules.validate(s).passed for s in subs)
    assert trajectory.subtasks_from_failures(records, {composed.id: composed}, {composed.id: 0.6}) == []


class RecordedJudger:
    """A stand-in judger model that answers with recorded replies, in order."""

    def __init__(self, *replies):
        self.replies, self.asked = list(replies), []

    def chat(self, role, system, user):
        self.asked.append(user)
        return self.replies.pop(0)


def test_without_a_success_the_judger_names_the_deviation_and_an_unusable_reply_costs_one_episode():
    _, b, composed = two_goals()
    done = A.render_action(A.Done())
    records = [
        record(composed.id, F, [said("The note first.", composed.solution[0]), WRONG_APPEND, done]),
        record(composed.id, N, [WRONG_APPEND]),
    ]
    judger = RecordedJudger('{"step": 1}', "I cannot tell where it went wrong.")
    subs = trajectory.subtasks_from_failures(records, {composed.id: composed}, pass_rates(records), judger)
    assert [(s.instruction, s.setup_actions) for s in subs] == [(b.instruction, [records[0].replies[0]])]
    assert len(judger.asked) == 2 and composed.instruction in judger.asked[0]


def test_task_folders_are_read_with_clear_errors(tmp_path):
    _, files = run_tasks(tmp_path)
    assert sorted(pipeline.read_task_dirs([tmp_path / "verigen" / "tasks"])) == sorted(
        pipeline.read_task_dirs([tmp_path / "verigen"])
    )  # a plain folder of task JSON reads the same
    with pytest.raises(ValueError, match="is in both"):
        pipeline.read_task_dirs([tmp_path / "verigen", tmp_path / "verigen" / "tasks"])
    with pytest.raises(ValueError, match="does not exist"):
        pipeline.read_task_dirs([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no task files"):
        pipeline.read_task_dirs([tmp_path / "empty"])


# ---- end to end: python -m experiments.synthesize from a run's workdir ------------------


@pytest.mark.docker
@pytest.mark.slow
def test_synthesize_entry_point_from_a_run_on_the_desktop_pool(tmp_path):
    _, b, failing = two_goals()
    solved = [
        templates.render("file_create", {"dir": f"/root/{d}", "name": f"{d}_note.txt", "content": f"{d} 7"})
        for d in ("alpha", "beta")
    ]
    pipeline.write_tasks([failing] + solved, tmp_path / "verigen")
    replies = [said("First the note.", failing.solution[0]), WRONG_APPEND, A.render_action(A.Done())]
    workdir = tmp_path / "run"
    log = EpisodeLog(workdir / EPISODE_LOG)
    log.append(0, [episode(failing.id, F, replies, 0), episode(solved[0].id, S, solved[0].solution, 1)], {})
    log.append(1, [episode(failing.id, F, replies, 2), episode(solved[1].id, S, solved[1].solution, 3)], {})

    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "experiments.synthesize",
        "--config=experiments/configs/verigen.py",
        f"--config.out_dir={out}",
        f"--config.from_run.workdir={workdir}",
        f"--config.from_run.task_dirs={tmp_path / 'verigen'}",
        "--config.pool.size=2",
        "--config.workers=2",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    from_run = report["from_run"]
    assert from_run["pass_rates"] == {failing.id: 0.0, solved[0].id: 1.0, solved[1].id: 1.0}
    assert (from_run["subtasks"], from_run["composed"], from_run["accepted"]) == (1, 1, 2), from_run["rejected"]
    assert (report["from_scratch"]["tasks"], report["from_scratch"]["passed"]) == (2, 2), report["from_scratch"]
    written = {c.metadata["augmentation"]: c for c in pipeline.read_tasks(out / "from_run")}
    assert written["trajectory_subtask"].setup_actions == replies[:1]  # the run's real prefix, replayed
    assert written["trajectory_subtask"].instruction == b.instruction
    assert sorted(written["trajectory_composed"].metadata["parents"]) == sorted(c.id for c in solved)
    assert "wrote 2 tasks to" in done.stdout
