"""JSON / YAML, CSV and SQLite metrics, and OSWorld's value rules."""

import json
import operator
import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cua_jax.tasks.metrics import JudgeError, match_value
from cua_jax.tasks.metrics import data as D
from cua_jax.tasks.metrics.base import approximately_equal, match_record


def write(path, content):
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


# ---- value rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, method, ref, expected",
    [
        ("Hello World", "re", "W.rld", True),
        ("hello", "re", "^H", False),
        ("hello", "re.I", "^H", True),
        ("a\nb", "re.M.I", "^B$", True),
        (None, "re", "x", False),
        (3, "eq", 3, True),
        (3, "ne", 3, False),
        (2, "lt", 3, True),
        (3, "le", 3, True),
        (4, "gt", 3, True),
        (3, "ge", 4, False),
        (None, "lt", 3, False),
        ("2.004", "approx:0.01", 2, True),
        ("2.1", "approx:0.01", 2, False),
        ("x", "approx:1", 2, False),
        (1, "range.te", [0, 1], True),
        (0, "range.te", [0, 1], False),
        (0, "range.et", [0, 1], True),
        (1, "range.tt", [0, 1], False),
        ('"b,a"', "str_set_eq", ["a", "b"], True),
        ("b,a", "str_list_eq", ["a", "b"], False),
        ("A1:B5", "spreadsheet_range", ["A1:A2", "A1:C9"], True),
        ("A1:D5", "spreadsheet_range", ["A1:A2", "A1:C9"], False),
    ],
)
def test_match_value_methods(value, method, ref, expected):
    assert match_value(value, {"method": method, "ref": ref}) is expected


@pytest.mark.parametrize(
    "value_rule, fragment",
    [
        ({"method": "like", "ref": 1}, "unknown match method"),
        ({"method": "re.NOPE", "ref": "x"}, "unknown regular-expression flag"),
        ({"method": "range.xy", "ref": [0, 1]}, "range.XY"),
        ({"ref": 1}, "needs a 'method'"),
    ],
)
def test_match_value_rejects_bad_rules(value_rule, fragment):
    with pytest.raises(JudgeError, match=fragment):
        match_value("1", value_rule)


@given(st.integers(-50, 50), st.integers(-50, 50))
def test_match_value_orderings_agree_with_operator(a, b):
    for name in ("eq", "ne", "le", "lt", "ge", "gt"):
        assert match_value(a, {"method": name, "ref": b}) == getattr(operator, name)(a, b)


@given(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6), st.floats(0, 10))
def test_approx_rule_is_an_absolute_tolerance(value, ref, threshold):
    assert match_value(value, {"method": f"approx:{threshold!r}", "ref": ref}) == (abs(value - ref) <= threshold)


@given(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6), st.floats(0, 1))
def test_approximately_equal_is_symmetric_relative_tolerance(a, b, tolerance):
    assert approximately_equal(a, b, tolerance) == approximately_equal(b, a, tolerance)
    assert approximately_equal(a, a, tolerance)
    if a != b and a != 0 and b != 0:
        assert approximately_equal(a, b, tolerance) == (abs(a - b) / max(abs(a), abs(b)) <= tolerance)


def test_match_record():
    assert match_record({"a": 1}, {"a": 1, "b": 2})
    assert not match_record({"a": 1, "c": 3}, {"a": 1, "b": 2})


# ---- JSON ----------------------------------------------------------------------------


def test_check_json_project_and_osworld_methods(tmp_path):
    path = write(tmp_path / "s.json", {"editor": {"fontSize": 14, "theme": "Dark+"}, "tags": ["a", "b"]})
    rules = {
        "expect": [
            {"key": ["editor", "fontSize"], "method": "eq", "ref": 14},
            {"key": ["tags"], "method": "has", "ref": "b"},
            {"key": ["editor", "theme"], "method": "re", "ref": "^Dark"},
            {"key": ["editor", "fontSize"], "method": "range.ee", "ref": [12, 16]},
            {"key": ["editor"], "method": "exists"},
        ],
        "unexpect": [{"key": ["editor", "wordWrap"], "method": "eq", "ref": "on"}],
    }
    assert D.check_json(path, rules) == 1.0
    assert D.check_json(path, {"expect": [{"key": ["editor", "fontSize"], "method": "gt", "ref": 14}]}) == 0.0
    assert D.check_json(path, {"expect": [{"key": ["missing"], "method": "re", "ref": "x"}]}) == 0.0
    assert D.check_json(path, {"unexpect": [{"key": ["tags"], "method": "has", "ref": "a"}]}) == 0.0
    with pytest.raises(JudgeError, match="bad check_json rule"):
        D.check_json(path, {"expect": [{"key": ["editor"], "method": "approximately"}]})


def test_check_json_yaml(tmp_path):
    path = write(tmp_path / "c.yaml", "server:\n  port: 8080\n")
    assert (
        D.check_json(path, {"expect": [{"key": ["server", "port"], "method": "eq", "ref": 8080}]}, is_yaml=True) == 1.0
    )
    assert D.check_json(path, {"expect": [{"key": ["server", "port"], "method": "eq", "ref": 80}]}, is_yaml=True) == 0.0
    assert D.check_json(write(tmp_path / "e.yaml", ""), {"expect": []}, is_yaml=True) == 0.0


def test_check_direct_json_object():
    rules = {"expected": {"name": "Ann", "tags": ["x", "y"]}}
    assert D.check_direct_json_object("{'name': 'Ann', 'tags': ['x', 'y']}", rules) == 1.0
    assert D.check_direct_json_object({"name": "Bob", "tags": ["x", "y"]}, rules) == 0.0
    unordered = {"expected": {"tags": ["y", "x"], "ignore_list_order": True}}
    assert D.check_direct_json_object({"tags": ["x", "y"]}, unordered) == 1.0
    assert D.check_direct_json_object({"tags": ["x"]}, unordered) == 0.0
    inside = {"expected": {"city": ["Paris", "Lyon"], "note": "ok"}, "expect_in_result": True}
    assert D.check_direct_json_object({"city": "Lyon", "note": "all ok"}, inside) == 1.0
    assert D.check_direct_json_object({"city": ["Nice"], "note": "all ok"}, inside) == 0.0
    assert D.check_direct_json_object("not json", rules) == 0.0
    with pytest.raises(JudgeError, match="__EVALUATION_FAILED__"):
        D.check_direct_json_object({}, {"expected": {"a": "__EVALUATION_FAILED__"}})


def test_json_settings_keybindings_subsets(tmp_path):
    settings = write(tmp_path / "settings.json", {"files.autoSave": "afterDelay", "editor.tabSize": 2})
    assert D.check_json_settings(settings, {"expected": {"editor.tabSize": 2}}) == 1.0
    assert D.check_json_settings(settings, {"expected": {"editor.tabSize": 4}}) == 0.0
    binding = {"key": "ctrl+j", "command": "workbench.action.togglePanel"}
    keys = write(tmp_path / "keybindings.json", "// Place your key bindings in this file\n" + json.dumps([binding]))
    assert D.check_json_keybindings(keys, {"expected": binding}) == 1.0
    assert D.check_json_keybindings(keys, {"expected": {**binding, "key": "ctrl+k"}}) == 0.0
    assert D.is_included_all_json_objects(write(tmp_path / "g.json", {"a": 1}), settings) == 0.0
    assert D.is_included_all_json_objects(write(tmp_path / "h.json", {"editor.tabSize": 2}), settings) == 1.0


def test_compare_config_containment_and_strict(tmp_path):
    path = write(tmp_path / "cfg.json", {"a": {"b": 1, "c": 2}, "d": [1, 2]})
    assert D.compare_config(path, {"expected": json.dumps({"a": {"b": 1}})}) == 1.0
    assert D.compare_config(path, {"expected": json.dumps({"a": {"b": 2}})}) == 0.0
    assert D.compare_config(path, {"expected": json.dumps({"a": {"b": 1}})}, containment_ok=False) == 0.0
    assert (
        D.compare_config(path, {"expected": json.dumps({"d": [1, 2], "a": {"c": 2, "b": 1}})}, containment_ok=False)
        == 1.0
    )
    text = write(tmp_path / "cfg.ini", "[x]\nkey = value\n")
    assert D.compare_config(text, {"expected": "key = value"}) == 1.0
    assert D.compare_config(text, {"expected": "key = other"}) == 0.0


def test_json_subset_properties():
    assert D.json_subset({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}})
    assert not D.json_subset({"a": [1]}, {"a": [1, 2]})  # lists compare whole


# ---- CSV -----------------------------------------------------------------------------


def test_check_csv_records(tmp_path):
    path = write(tmp_path / "accounts.csv", "url,user\nimap://x,ann\nsmtp://x,ann\n")
    assert D.check_csv(path, {"expect": [{"url": "imap://x", "user": "ann"}], "unexpect": [{"user": "bob"}]}) == 1.0
    assert D.check_csv(path, {"expect": [{"url": "pop://x"}]}) == 0.0
    assert D.check_csv(path, {"unexpect": [{"user": "ann"}]}) == 0.0


def test_compare_csv_options_and_alternatives(tmp_path):
    expected = write(tmp_path / "e.csv", "a,b\n1,2\n")
    assert D.compare_csv(write(tmp_path / "r.csv", "a,b\n1,2\n"), expected) == 1.0
    loose = write(tmp_path / "l.csv", " A,B \n1,2\n")
    assert D.compare_csv(loose, expected) == 0.0
    assert D.compare_csv(loose, expected, strict=False, ignore_case=True) == 1.0
    other = write(tmp_path / "o.csv", "x\n")
    assert D.compare_csv(write(tmp_path / "r2.csv", "x\n"), [expected, other]) == 1.0
    assert D.compare_csv(write(tmp_path / "bom.csv", "\ufeffa,b\n1,2\n"), expected) == 1.0
    with pytest.raises(JudgeError, match="missing"):
        D.compare_csv(other, str(tmp_path / "absent.csv"))


# ---- SQLite --------------------------------------------------------------------------


def test_run_sqlite3_read_only(tmp_path):
    path = str(tmp_path / "db.sqlite")
    with sqlite3.connect(path) as db:
        db.execute("create table t (x integer)")
        db.execute("insert into t values (1), (2)")
    assert D.run_sqlite3(path, {"sql": "select sum(x) = 3 from t"}) == 1.0
    assert D.run_sqlite3(path, {"sql": "select count(*) > 5 from t"}) == 0.0
    assert D.run_sqlite3(write(tmp_path / "not.sqlite", "plain text, not a database"), {"sql": "select 1"}) == 0.0
    with pytest.raises(JudgeError, match="query failed"):
        D.run_sqlite3(path, {"sql": "delete from t"})
    with pytest.raises(JudgeError, match="query failed"):
        D.run_sqlite3(path, {"sql": "select * from no_such_table"})
    with sqlite3.connect(path) as db:
        assert db.execute("select count(*) from t").fetchone()[0] == 2  # untouched
