"""The web-application judges on tiny hand-built SQLite databases (no Trac needed)."""

import random
import shutil
import sqlite3

import pytest

from cua_jax.envs.webapp import judges


def _make_db(path, extra_sql=()):
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE ticket (id integer PRIMARY KEY, status text, owner text, changetime integer, summary text);
        CREATE TABLE ticket_change (ticket integer, time integer, field text, newvalue text,
                                    UNIQUE (ticket, time, field));
        CREATE TABLE permission (username text, action text);
        CREATE TABLE session (sid text, last_visit integer);
        INSERT INTO ticket VALUES (1, 'new', 'alice', 100, 'Login fails'), (2, 'new', 'bob', 100, 'Slow page');
        INSERT INTO permission VALUES ('anonymous', 'TICKET_VIEW');
        """
    )
    for sql in extra_sql:
        db.execute(sql)
    db.commit()
    db.close()
    return str(path)


@pytest.fixture
def base(tmp_path):
    return _make_db(tmp_path / "base.db")


def _branch(tmp_path, base, *sql):
    path = tmp_path / "branch.db"
    shutil.copy(base, path)
    db = sqlite3.connect(path)
    for s in sql:
        db.execute(s)
    db.commit()
    db.close()
    return str(path)


def _task(eval_spec):
    return {"task_id": "t-1", "eval": eval_spec}


CLOSE_1 = {
    "eval_types": ["db_diff"],
    "db_diff": {
        "must": [{"table": "ticket", "op": "update", "where": {"id": 1}, "set": {"status": "closed"}}],
        "may": [
            {"table": "ticket", "op": "update", "where": {"id": 1}, "columns": ["changetime"]},
            {"table": "ticket_change", "op": "insert", "where": {"ticket": 1}},
        ],
    },
}


def test_db_diff_passes_the_required_change_with_its_allowed_side_effects(tmp_path, base):
    branch = _branch(
        tmp_path,
        base,
        "UPDATE ticket SET status='closed', changetime=200 WHERE id=1",
        "INSERT INTO ticket_change VALUES (1, 200, 'status', 'closed')",
        "INSERT INTO session VALUES ('abc', 5)",  # ephemeral: a page view writes it
    )
    assert judges.judge(_task(CLOSE_1), None, "/ticket/1", branch, base) == judges.Verdict(1.0, ())


def test_db_diff_names_collateral_damage(tmp_path, base):
    branch = _branch(
        tmp_path,
        base,
        "UPDATE ticket SET status='closed', changetime=200 WHERE id=1",
        "UPDATE ticket SET owner='mallory' WHERE id=2",
        "DELETE FROM permission",
    )
    verdict = judges.judge(_task(CLOSE_1), None, "/ticket/1", branch, base)
    assert verdict.score == 0.0
    assert any("collateral change of ['owner']" in r and "'id': 2" in r for r in verdict.reasons)
    assert any("collateral change: delete permission" in r for r in verdict.reasons)
    assert len(verdict.reasons) == 2


def test_db_diff_an_uncovered_column_of_the_edited_row_is_collateral(tmp_path, base):
    branch = _branch(tmp_path, base, "UPDATE ticket SET status='closed', summary='x' WHERE id=1")
    verdict = judges.judge(_task(CLOSE_1), None, "/", branch, base)
    assert verdict.score == 0.0 and "['summary']" in verdict.reasons[0]


def test_db_diff_a_may_without_columns_covers_any_column(tmp_path, base):
    spec = {
        "eval_types": ["db_diff"],
        "db_diff": {
            "must": CLOSE_1["db_diff"]["must"],
            "may": [{"table": "ticket", "op": "update", "where": {"id": 1}}],
        },
    }
    branch = _branch(tmp_path, base, "UPDATE ticket SET status='closed', summary='x' WHERE id=1")
    assert judges.judge(_task(spec), None, "/", branch, base).score == 1.0


def test_db_diff_requires_the_must_and_the_right_value(tmp_path, base):
    branch = _branch(tmp_path, base, "UPDATE ticket SET status='accepted' WHERE id=1")
    verdict = judges.judge(_task(CLOSE_1), None, "/", branch, base)
    assert verdict.score == 0.0
    assert any("required change did not happen" in r for r in verdict.reasons)
    unchanged = _branch(tmp_path, base)
    assert judges.judge(_task(CLOSE_1), None, "/", unchanged, base).score == 0.0


def test_db_diff_insert_matches_where_and_set_and_contains(tmp_path, base):
    spec = {
        "eval_types": ["db_diff"],
        "db_diff": {
            "must": [
                {
                    "table": "ticket",
                    "op": "insert",
                    "where": {"summary": {"contains": "CSV"}},
                    "set": {"owner": "carol", "status": "new"},
                }
            ]
        },
    }
    good = _branch(tmp_path, base, "INSERT INTO ticket VALUES (3, 'new', 'carol', 300, 'CSV export')")
    assert judges.judge(_task(spec), None, "/", good, base).score == 1.0
    wrong_owner = _branch(tmp_path, base, "INSERT INTO ticket VALUES (3, 'new', 'dave', 300, 'CSV export')")
    verdict = judges.judge(_task(spec), None, "/", wrong_owner, base)
    assert verdict.score == 0.0 and len(verdict.reasons) == 2  # the must is missing and the insert is collateral


def test_db_diff_keyless_tables_count_duplicate_rows(tmp_path, base):
    spec = {"eval_types": ["db_diff"], "db_diff": {"must": [{"table": "permission", "op": "insert"}]}}
    branch = _branch(
        tmp_path,
        base,
        "INSERT INTO permission VALUES ('anonymous', 'TICKET_VIEW')",
        "INSERT INTO permission VALUES ('anonymous', 'TICKET_VIEW')",
    )
    changes = judges.diff_databases(base, branch)
    assert [c.op for c in changes] == ["insert", "insert"]
    assert judges.judge(_task(spec), None, "/", branch, base).score == 1.0


def test_db_diff_of_a_database_against_itself_is_empty_for_random_tables(tmp_path):
    rng = random.Random(7)
    for trial in range(10):
        path = tmp_path / f"random{trial}.db"
        db = sqlite3.connect(path)
        for t in range(rng.randint(1, 4)):
            n_cols = rng.randint(1, 4)
            key = rng.choice(["", f", PRIMARY KEY (c0{', c1' if n_cols > 1 else ''})", ", UNIQUE (c0)"])
            cols = ", ".join(f"c{i} {rng.choice(['numeric', 'text', ''])}" for i in range(n_cols))
            db.execute(f"CREATE TABLE t{t} ({cols}{key})")
            for _ in range(rng.randint(0, 30)):
                values = [
                    rng.choice([None, rng.randint(-5, 5), rng.choice(["a", "b", "'; DROP"]), 1.5])
                    for _ in range(n_cols)
                ]
                db.execute(f"INSERT OR IGNORE INTO t{t} VALUES ({', '.join('?' * n_cols)})", values)
        db.commit()
        db.close()
        copy = tmp_path / f"copy{trial}.db"
        shutil.copy(path, copy)
        assert judges.diff_databases(str(path), str(path)) == []
        assert judges.diff_databases(str(path), str(copy)) == []


def test_the_judge_never_writes_the_episode_database(tmp_path, base):
    spec = {"eval_types": ["db_query"], "db_query": {"sql": "DELETE FROM ticket", "expected": []}}
    with pytest.raises(sqlite3.OperationalError):
        judges.judge(_task(spec), None, "/", base, base)
    db = sqlite3.connect(base)
    assert db.execute("SELECT count(*) FROM ticket").fetchone() == (2,)


def test_db_query_compares_rows_as_a_multiset_or_in_order(tmp_path, base):
    query = {"sql": "SELECT id, owner FROM ticket ORDER BY id", "expected": [[2, "bob"], [1, "alice"]]}
    assert judges.judge(_task({"eval_types": ["db_query"], "db_query": query}), None, "/", base, base).score == 1.0
    ordered = {**query, "ordered": True}
    verdict = judges.judge(_task({"eval_types": ["db_query"], "db_query": [ordered]}), None, "/", base, base)
    assert verdict.score == 0.0 and "db_query" in verdict.reasons[0]
    fewer = {"sql": query["sql"], "expected": [[1, "alice"]]}
    assert judges.judge(_task({"eval_types": ["db_query"], "db_query": fewer}), None, "/", base, base).score == 0.0


def test_sql_looking_ticket_text_is_data_not_a_query(tmp_path, base):
    evil = "x'); DELETE FROM ticket; --"
    branch = _branch(tmp_path, base, f"UPDATE ticket SET summary={evil!r}".replace("\\'", "''") + " WHERE id=2")
    verdict = judges.judge(_task(CLOSE_1), None, "/", branch, base)
    assert verdict.score == 0.0 and any("collateral" in r for r in verdict.reasons)
    assert sqlite3.connect(branch).execute("SELECT count(*) FROM ticket").fetchone() == (2,)


def _string_task(refs, **extra):
    return _task({"eval_types": ["string_match"], "reference_answers": refs, **extra})


def test_string_match_exact_must_include_and_fuzzy(base):
    exact = _string_task({"exact_match": "judy"})
    assert judges.judge(exact, ' "Judy" ', None, base, base).score == 1.0
    assert judges.judge(exact, "judy and carol", None, base, base).score == 0.0
    assert judges.judge(exact, None, None, base, base).reasons == ("string_match: the episode ended without an answer",)

    include = _string_task({"must_include": ["#4", "#12"]})
    assert judges.judge(include, "Tickets #4 and #12.", None, base, base).score == 1.0
    verdict = judges.judge(include, "Only #4", None, base, base)
    assert verdict.score == 0.0 and "'#12'" in verdict.reasons[0]
    single_char = _string_task({"must_include": ["4"]})
    assert judges.judge(single_char, "14 tickets", None, base, base).score == 0.0  # a whole token, as WebArena
    assert judges.judge(single_char, "4 tickets", None, base, base).score == 1.0

    fuzzy = _string_task({"fuzzy_match": ["4"]})
    assert judges.judge(fuzzy, "Four.", None, base, base).score == 1.0
    assert judges.judge(fuzzy, "4 or 5", None, base, base).score == 0.0


def test_string_match_na(base):
    na = _string_task({"fuzzy_match": "N/A"}, string_note="no such milestone")
    assert judges.judge(na, "N/A", None, base, base).score == 1.0
    assert judges.judge(na, "N/A: there is no milestone 3.0", None, base, base).score == 1.0
    assert judges.judge(na, "2024-11-16", None, base, base).score == 0.0


def test_url_match_gold_in_pred_with_or_and_query(base):
    task = _task(
        {
            "eval_types": ["url_match"],
            "reference_url": "/report/3 |OR| /query?milestone=1.0&status=new",
            "url_note": "GOLD in PRED",
        }
    )
    assert judges.judge(task, None, "/query?status=new&milestone=1.0&order=id", base, base).score == 1.0
    # every parameter the references name must be present with one of their values, as WebArena
    verdict = judges.judge(task, None, "/report/3/", base, base)
    assert verdict.score == 0.0 and any("milestone" in r for r in verdict.reasons)
    only_path = _task({"eval_types": ["url_match"], "reference_url": "/report/3 |OR| /report/6"})
    assert judges.judge(only_path, None, "/report/6?asc=1", base, base).score == 1.0
    assert judges.judge(only_path, None, "/report/2", base, base).score == 0.0


def test_evaluators_are_anded(tmp_path, base):
    task = _task(
        {
            "eval_types": ["string_match", "url_match"],
            "reference_answers": {"exact_match": "bob"},
            "reference_url": "/ticket/7",
        }
    )
    assert judges.judge(task, "bob", "/ticket/7", base, base).score == 1.0
    verdict = judges.judge(task, "alice", "/ticket/8", base, base)
    assert verdict.score == 0.0 and len(verdict.reasons) == 2


def test_unknown_eval_type_and_malformed_specs_are_named(base):
    with pytest.raises(ValueError, match=r"task t-1: unknown eval type 'program_html'"):
        judges.judge(_task({"eval_types": ["program_html"]}), None, "/", base, base)
    with pytest.raises(ValueError, match=r"eval.reference_url"):
        judges.judge(_task({"eval_types": ["url_match"]}), None, "/", base, base)
    with pytest.raises(ValueError, match=r"eval.db_diff.may\[0\]"):
        judges.validate_eval(
            {"eval_types": ["db_diff"], "db_diff": {"may": [{"table": "ticket", "op": "upsert"}]}}, "f.json"
        )
    with pytest.raises(ValueError, match=r"ephemeral table 'session'"):
        judges.validate_eval(
            {"eval_types": ["db_diff"], "db_diff": {"may": [{"table": "session", "op": "insert"}]}}, "f.json"
        )
