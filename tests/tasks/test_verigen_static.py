"""VeriGen's static parts: templates, rule validator, judger, fixer, reply parsing,
trajectory alignment and composition, similarity math and the overlap audit."""

import json
import random

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.envs import actions as A
from cua_jax.tasks.schema import parse_task
from cua_jax.tasks.suites.desktop.solutions import SUITE_DIR
from cua_jax.tasks.verigen import audit, llm, rules, templates, trajectory
from cua_jax.tasks.verigen.candidate import Candidate, Feedback
from cua_jax.tasks.verigen.pipeline import ProposalError
from cua_jax.tasks.verigen.roles import ProgrammaticJudger, TemplateFixer
from cua_jax.tasks.verigen.similarity import max_similarity, max_similarity_np, threshold_clusters


def sample(family, seed=0):
    return templates.render(family, templates.FAMILIES[family][0](random.Random(seed)))


@pytest.mark.parametrize("family", sorted(templates.FAMILIES))
def test_every_family_renders_a_valid_reviewed_task(family):
    candidate = sample(family)
    assert parse_task(candidate.task).evaluator.entry == candidate.judge_entry
    assert rules.validate(candidate).passed, rules.validate(candidate).reasons
    assert ProgrammaticJudger().review(candidate).passed
    assert templates.render(family, candidate.metadata["spec"]).task == candidate.task  # deterministic
    round_trip = Candidate.from_task_json(json.loads(json.dumps(candidate.to_task_json())))
    assert (round_trip.task, round_trip.solution, round_trip.parts) == (
        candidate.task,
        candidate.solution,
        candidate.parts,
    )


def test_proposer_proposes_distinct_tasks_over_every_application():
    proposer = templates.TemplateProposer(seed=3)
    batch = proposer.propose(60)
    assert len({c.id for c in batch}) == 60 and len({c.instruction for c in batch}) == 60
    assert {c.metadata["app"] for c in batch} == {"files", "terminal", "mousepad", "gnumeric"}


@pytest.mark.parametrize(
    "defect, role",
    [
        ("nondeterministic_judge", "rule"),
        ("judge_writes", "rule"),
        ("unbounded_loop", "rule"),
        ("unstated_value", "judger"),
        ("wrong_path", "judger"),
    ],
)
def test_each_defect_is_caught_by_its_role_and_repaired_by_the_fixer(defect, role):
    clean = sample("file_append", seed=7)
    broken = templates.DEFECTS[defect](clean.copy(), random.Random(0))
    rule, review = rules.validate(broken), ProgrammaticJudger().review(broken)
    failing = rule if role == "rule" else review
    assert not failing.passed and failing.reasons
    fixed = TemplateFixer().fix(broken, [failing])
    assert fixed is not None and fixed.repairs[-1]["changed"]
    assert rules.validate(fixed).passed and ProgrammaticJudger().review(fixed).passed
    assert TemplateFixer().fix(fixed, [Feedback(role, False, ["again"])]) is None  # nothing left to change


@pytest.mark.parametrize(
    "code, problem",
    [
        ("import socket\ndef j():\n    return 1.0\n", "network"),
        ("import subprocess\ndef j():\n    return 1.0\n", "imports 'subprocess'"),
        ("def j():\n    return j()\n", "calls itself"),
        ("def j():\n    for _ in iter(int, 1):\n        pass\n    return 1.0\n", "iter()"),
        ("import os\ndef j():\n    os.remove('/root/x')\n    return 1.0\n", "writes"),
        ("def j(path):\n    return 1.0\n", "no arguments"),
        ("def k():\n    return 1.0\n", "no top-level function 'j'"),
        ("def j(:\n", "not valid Python"),
    ],
)
def test_judge_rules_name_the_problem(code, problem):
    problems = rules.judge_problems(code, "j")
    assert any(problem in p for p in problems), problems


def test_setup_rules_reject_network_and_writes_outside_the_work_roots():
    problems = rules.setup_problems(
        [
            {"type": "execute", "parameters": {"command": "curl http://example.com -o /root/x", "shell": True}},
            {"type": "execute", "parameters": {"command": ["cp", "/root/a", "/etc/passwd"]}},
            {"type": "download", "parameters": {"files": [{"url": "https://example.com/x", "path": "/root/x"}]}},
        ]
    )
    assert any("runs curl" in p for p in problems)
    assert any("/etc/passwd" in p for p in problems)
    assert any("downloads https://example.com/x" in p for p in problems)


def test_extract_json_and_reply_parsing_reject_malformed_output():
    assert llm.extract_json('Sure! ```json\n{"a": {"b": 1}}\n``` done', "x") == {"a": {"b": 1}}
    with pytest.raises(ProposalError, match="no JSON object"):
        llm.extract_json("I cannot help with that.", "proposer")
    with pytest.raises(ProposalError, match="lacks 'judge_code'"):
        llm.candidate_from_reply({"instruction": "x", "judge_entry": "j", "solution": []}, "proposer")
    with pytest.raises(ProposalError, match="action 0 is invalid"):
        llm.candidate_from_reply(
            {"instruction": "x", "judge_code": "", "judge_entry": "j", "solution": [{"action": "teleport"}]}, "proposer"
        )
    reply = llm.candidate_to_reply(sample("file_create"))
    again = llm.candidate_from_reply(reply, "fixer")
    assert again.solution == sample("file_create").solution and again.judge_code == reply["judge_code"]


def test_chat_client_retries_transient_failures_and_timeouts_against_a_replay_stand_in():
    """The server is a loopback STAND-IN replaying recorded responses, not a model."""
    from cua_jax.tasks.verigen.replay_server import ReplayServer

    verdict = json.dumps({"pass": True, "score": 0.8, "reasons": []})
    recording = [
        {"role": "judger", "status": 503, "content": ""},  # transient: retried
        {"role": "judger", "content": verdict},
        {"role": "judger", "delay_s": 3.0, "content": verdict},  # past the per-call timeout: retried
        {"role": "judger", "content": verdict},
        {"role": "judger", "content": "no verdict here"},
    ]
    with ReplayServer(recording) as server:
        chat = llm.ChatClient(server.base_url, "replay", timeout=1.0, retries=1, backoff=0.05)
        judger = llm.LLMJudger(chat)
        first, second, third = (judger.review(sample("file_create")) for _ in range(3))
    assert (first.passed, first.score, second.passed) == (True, 0.8, True)
    assert not third.passed and "no JSON object" in third.reasons[0]
    assert [c.attempts for c in chat.ledger.calls] == [2, 2, 1]
    assert chat.ledger.summary()["by_role"]["judger"]["retries"] == 2


# ---- trajectory-guided synthesis ----------------------------------------------------

action_texts = st.lists(
    st.sampled_from(
        [
            A.render_action(a)
            for a in (A.Key(("ctrl", "s")), A.Key(("down",)), A.Type("x"), A.Wait(1.0), A.Click("left_click", 10, 20))
        ]
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(action_texts, action_texts)
def test_earliest_deviation_is_the_first_differing_step(steps, reference):
    d = trajectory.earliest_deviation(steps, reference)
    assert steps[:d] == reference[:d]
    assert d == min(len(steps), len(reference)) or steps[d] != reference[d]


def test_subtask_starts_at_the_deviation_and_checks_the_sub_goal():
    a, b = sample("file_create", 1), sample("file_append", 2)
    assert trajectory.compatible(a, b)
    composed = trajectory.compose(a, b)
    assert rules.validate(composed).passed
    assert [p.entry for p in composed.parts] == [a.judge_entry, b.judge_entry]
    assert "min(" in composed.judge_code and composed.instruction.startswith(a.instruction.rstrip("."))
    # departing at the second goal's first step: the sub-task is the second goal alone
    sub = trajectory.subtask_at(composed, composed.parts[1].start)
    assert sub.instruction == b.instruction and sub.judge_entry == b.judge_entry
    assert sub.setup_actions == composed.solution[: composed.parts[1].start]
    assert A.is_terminal(A.parse_action(sub.solution[-1])) and rules.validate(sub).passed
    assert trajectory.subtask_at(a, 0) is None  # nothing easier than a one-goal task from its start


# ---- similarity and the overlap audit -------------------------------------------------

vectors = st.integers(1, 6).flatmap(
    lambda d: st.tuples(
        st.lists(st.lists(st.floats(-4, 4), min_size=d, max_size=d), min_size=1, max_size=5),
        st.lists(st.lists(st.floats(-4, 4), min_size=d, max_size=d), min_size=1, max_size=5),
    )
)


@settings(max_examples=40, deadline=None)
@given(vectors)
def test_max_similarity_matches_numpy(pair):
    a, b = (np.asarray(x, np.float32) for x in pair)
    np.testing.assert_allclose(jax.jit(max_similarity)(a, b), max_similarity_np(a, b), atol=1e-4)


def test_threshold_clusters_are_connected_components():
    sim = np.eye(5)
    sim[0, 2] = sim[2, 0] = sim[2, 4] = sim[4, 2] = 0.95
    assert threshold_clusters(sim, 0.9) == [[0, 2, 4], [1], [3]]


@pytest.fixture(scope="module")
def embedder():
    from cua_jax.tasks.verigen.similarity import MiniLMEmbedder

    return MiniLMEmbedder()


def test_minilm_embeddings_rank_paraphrases_above_unrelated_text(embedder):
    v = embedder.encode(
        [
            "Rename the file notes.txt to todo.txt",
            "Change the name of notes.txt to todo.txt",
            "Enter 5 in cell B3 of the spreadsheet",
        ]
    )
    assert v.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > 0.8 > v[0] @ v[2]


def test_overlap_audit_counts_each_kind_of_overlap(embedder):
    evaluation = [json.loads(p.read_text()) for p in sorted(SUITE_DIR.glob("*.json"))]
    copied = dict(evaluation[0], id="copy", source="elsewhere")  # same content, other provenance
    reworded = dict(evaluation[2], id="reworded", instruction=evaluation[2]["instruction"].upper() + "!!")
    fresh = [c.to_task_json() for c in templates.TemplateProposer(seed=1).propose(6)]
    table = audit.overlap_audit([copied, reworded] + fresh, evaluation, embedder.encode)
    assert table["full_json_duplicates"]["ids"] == ["copy"]
    assert table["instruction_exact_duplicates"]["ids"] == ["copy", "reworded"]
    assert set(table["judge_exact_reuse"]["ids"]) == {"copy", "reworded"}
    assert {"copy", "reworded"} <= set(table["objective_near_duplicates"]["ids"])
    assert not set(table["objective_near_duplicates"]["ids"]) & {t["id"] for t in fresh}
    assert 0.0 < table["similarity_p50"] <= table["similarity_p95"] <= 1.0 + 1e-6
    assert "verigen" in audit.format_audit("verigen", table)
