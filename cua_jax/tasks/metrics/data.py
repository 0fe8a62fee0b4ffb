"""Metrics on structured data files: JSON / YAML, CSV and SQLite (OSWorld's general.py,
table.py and vscode.py data checks). Spreadsheets are in sheets.py."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from typing import Any

from cua_jax.tasks.metrics.base import (
    JudgeError,
    expected_file,
    match_record,
    match_value,
    metric,
    read_text,
    result_file,
    rule,
)

_MISSING = object()


def json_at(value: Any, key: list) -> Any:
    """The value at a path of dict keys / list indices, or a sentinel when absent."""
    for part in key:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and -len(value) <= part < len(value):
            value = value[part]
        else:
            return _MISSING
    return value


# Methods of this project kept alongside OSWorld's (match_value): "has" (a list, string or
# object containing ref) and "exists" (the key path is present).
JSON_METHODS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda value, ref: value is not _MISSING and value == ref,
    "ne": lambda value, ref: value is not _MISSING and value != ref,
    "has": lambda value, ref: isinstance(value, (list, str, dict)) and ref in value,
    "exists": lambda value, ref: value is not _MISSING,
}


def _json_rule_holds(data: Any, item: Any, expected: bool) -> bool:
    if not isinstance(item, dict) or not isinstance(item.get("key"), list):
        raise JudgeError(f"bad check_json rule {item!r}: needs a 'key' list and a method")
    method = item.get("method", "eq")
    value = json_at(data, item["key"])
    if method in JSON_METHODS:
        return JSON_METHODS[method](value, item.get("ref"))
    if not isinstance(method, str):
        raise JudgeError(f"bad check_json rule {item!r}: the method must be a string")
    if value is _MISSING:
        # OSWorld: a missing key fails an expectation; an unexpectation compares None.
        if expected:
            return False
        value = None
    try:
        return match_value(value, {"method": method, "ref": item.get("ref")})
    except JudgeError as error:
        raise JudgeError(f"bad check_json rule {item!r}: {error}") from None


def _load_json_or_yaml(text: str, is_yaml: bool) -> Any:
    if not is_yaml:
        return json.loads(text)
    try:
        import yaml
    except ImportError:
        raise JudgeError("check_json with is_yaml needs the PyYAML package") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(str(error)) from None


@metric()
def check_json(result_path: str | None, rules: dict, is_yaml: bool = False, **_) -> float:
    """1 when the JSON (or YAML) file meets every rules['expect'] item and no
    rules['unexpect'] one.

    Items are {"key": [path...], "method": ..., "ref": value}. Methods: this project's
    eq / ne / has / exists, and OSWorld's value rules (re, le, lt, ge, gt, approx:T,
    range.XY, str_list_eq, str_set_eq; see base.match_value). A missing key fails an
    expectation; an empty YAML document or unparsable file scores 0.
    """
    if not isinstance(rules, dict):
        raise JudgeError(f"check_json needs rules with 'expect' / 'unexpect' lists, got {rules!r}")
    text = read_text(result_path)
    if text is None:
        return 0.0
    try:
        data = _load_json_or_yaml(text, is_yaml)
    except ValueError:
        return 0.0  # the agent wrote something that is not JSON / YAML
    if is_yaml and data is None:
        return 0.0
    holds_all = all(_json_rule_holds(data, item, True) for item in rules.get("expect", []))
    return float(holds_all and not any(_json_rule_holds(data, item, False) for item in rules.get("unexpect", [])))


@metric()
def check_direct_json_object(result: Any, rules: dict) -> float:
    """Compare a JSON object (a dict, or text with ' quotes read as ") with rules['expected'].

    Without rules['expect_in_result'], every expected key must hold an equal value (when
    the expected object has "ignore_list_order": true, list values compare sorted). With
    it, an expected list means one of its items is in the result's list (or equals the
    result's string), an expected string must be a substring of the result's value.
    """
    expected = rule(rules, "expected")
    if not isinstance(expected, dict):
        raise JudgeError(f"check_direct_json_object needs rules['expected'] to be an object, got {expected!r}")
    if any(value == "__EVALUATION_FAILED__" for value in expected.values()):
        raise JudgeError("the expected getter of check_direct_json_object failed (__EVALUATION_FAILED__)")
    if isinstance(result, str):
        try:
            result = json.loads(result.strip().replace("'", '"'))
        except ValueError:
            return 0.0
    if not isinstance(result, dict):
        return 0.0
    if not rules.get("expect_in_result", False):
        ignore_order = bool(expected.get("ignore_list_order", False))
        for key, wanted in expected.items():
            if key == "ignore_list_order":
                continue
            actual = result.get(key)
            if ignore_order:
                try:
                    if sorted(wanted) != sorted(actual):
                        return 0.0
                except TypeError:
                    return 0.0
            elif actual != wanted:
                return 0.0
        return 1.0
    for key, wanted in expected.items():
        actual = result.get(key)
        if isinstance(wanted, list):
            if not any(
                (isinstance(actual, list) and item in actual) or (isinstance(actual, str) and item == actual)
                for item in wanted
            ):
                return 0.0
        elif isinstance(wanted, str):
            if not isinstance(actual, str) or wanted not in actual:
                return 0.0
        else:
            raise JudgeError(
                f"check_direct_json_object with expect_in_result takes list or string values, "
                f"got {wanted!r} for {key!r}"
            )
    return 1.0


def _json_file(path: Any) -> Any:
    text = read_text(path)
    if text is None:
        return _MISSING
    try:
        return json.loads(text)
    except ValueError:
        return _MISSING


@metric()
def is_included_all_json_objects(first_path: str | None, second_path: str | None) -> float:
    """1 when every key of the first JSON file's object is in the second's with an equal
    value (OSWorld passes the gold file first)."""
    first, second = _json_file(first_path), _json_file(second_path)
    if not isinstance(first, dict) or not isinstance(second, dict):
        return 0.0
    return float(match_record(first, second))


@metric()
def check_json_settings(result_path: str | None, rules: dict, **_) -> float:
    """1 when the JSON settings file holds every key/value of rules['expected']."""
    wanted = rule(rules, "expected")
    if not isinstance(wanted, dict):
        raise JudgeError(f"check_json_settings needs rules['expected'] to be an object, got {wanted!r}")
    data = _json_file(result_path)
    return float(isinstance(data, dict) and match_record(wanted, data))


@metric()
def check_json_keybindings(result_path: str | None, rules: dict, **_) -> float:
    """1 when the keybindings JSON list (read whole, or after its first line, a comment
    VS Code writes) contains the object rules['expected']."""
    wanted = rule(rules, "expected")
    text = read_text(result_path)
    if text is None:
        return 0.0
    for candidate in (text, text.split("\n", 1)[1] if "\n" in text else ""):
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, list):
            return float(wanted in data)
    return 0.0


def json_subset(expected: Any, actual: Any) -> bool:
    """Whether `expected` is contained in `actual`: objects recursively by key, anything
    else (lists included) by equality."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and json_subset(v, actual[k]) for k, v in expected.items())
    return expected == actual


@metric()
def compare_config(result_path: str | None, rules: dict, containment_ok: bool = True, **_) -> float:
    """Compare a config file with the text rules['expected'].

    containment_ok (default): the expected JSON is a subset of the file's JSON (when
    either is not JSON: the expected text is a substring of the file). Otherwise the
    texts are equal, or both parse to equal JSON.
    """
    wanted = rule(rules, "expected")
    if not wanted:
        raise JudgeError("compare_config needs a non-empty rules['expected'] text")
    text = read_text(result_path)
    if text is None:
        return 0.0
    try:
        actual_json, expected_json = json.loads(text), json.loads(wanted)
    except (ValueError, TypeError):
        actual_json = expected_json = _MISSING
    if containment_ok:
        if actual_json is _MISSING:
            return float(isinstance(wanted, str) and wanted.strip() in text)
        return float(json_subset(expected_json, actual_json))
    return float(text == wanted or (actual_json is not _MISSING and actual_json == expected_json))


def read_text_any_encoding(path: str) -> str:
    """A text file as UTF-8 (a BOM dropped), or Latin-1 when it is not valid UTF-8."""
    data = open(path, "rb").read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


@metric()
def check_csv(result_path: str | None, rules: dict) -> float:
    """1 when every rules['expect'] record (a {column: value} pattern) matches some row of
    the CSV file (read with its header) and no rules['unexpect'] record matches any."""
    if not isinstance(rules, dict):
        raise JudgeError(f"check_csv needs rules with 'expect' / 'unexpect' records, got {rules!r}")
    local = result_file(result_path)
    if local is None:
        return 0.0
    rows = list(csv.DictReader(io.StringIO(read_text_any_encoding(local), newline="")))
    expect, unexpect = rules.get("expect", []), rules.get("unexpect", [])
    found = all(any(match_record(pattern, row) for row in rows) for pattern in expect)
    return float(found and not any(match_record(pattern, row) for pattern in unexpect for row in rows))


@metric()
def compare_csv(
    result_path: str | None, expected_paths: str | list, strict: bool = True, ignore_case: bool = False, **_
) -> float:
    """1 when the CSV file's lines equal those of the expected file (or of any of a list
    of expected files); strict=False strips each line, ignore_case lowers them."""
    candidates = [expected_paths] if isinstance(expected_paths, str) else expected_paths
    if not isinstance(candidates, list) or not candidates:
        raise JudgeError(f"compare_csv needs an expected file or a list of them, got {expected_paths!r}")
    local = result_file(result_path)
    if local is None:
        return 0.0

    def lines(path: str) -> list[str]:
        found = read_text_any_encoding(path).splitlines()
        if not strict:
            found = [line.strip() for line in found]
        return [line.lower() for line in found] if ignore_case else found

    result = lines(local)
    return float(any(result == lines(expected_file(path)) for path in candidates))


_SQL_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", -1),
}


def _read_only(action: int, *_) -> int:
    return sqlite3.SQLITE_OK if action in _SQL_ALLOWED else sqlite3.SQLITE_DENY


@metric()
def run_sqlite3(result_path: str | None, rules: dict) -> float:
    """The first column of the first row of the query rules['sql'] on the SQLite database,
    as a float (NULL or no row: 0). The query runs on a copy of the file and may only read
    (SELECT); anything else fails as a judge error."""
    sql = rule(rules, "sql")
    if not isinstance(sql, str):
        raise JudgeError(f"run_sqlite3 needs rules['sql'] to be a query string, got {sql!r}")
    local = result_file(result_path)
    if local is None:
        return 0.0
    with tempfile.TemporaryDirectory() as workspace:
        copy = shutil.copy(local, os.path.join(workspace, "database.sqlite"))
        connection = sqlite3.connect(copy)
        try:
            try:
                connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.DatabaseError:
                return 0.0  # not a database
            connection.set_authorizer(_read_only)
            try:
                row = connection.execute(sql).fetchone()
            except sqlite3.DatabaseError as error:
                raise JudgeError(f"run_sqlite3 query failed: {error}") from None
        finally:
            connection.close()
    if not row or row[0] is None:
        return 0.0
    try:
        return float(row[0])
    except (TypeError, ValueError):
        raise JudgeError(f"run_sqlite3 query gave {row[0]!r}, not a number") from None
