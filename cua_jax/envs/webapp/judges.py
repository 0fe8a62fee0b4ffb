# Single job: score a finished web-application episode from its task's `eval` spec.
"""Judges of web-application tasks: WebArena's evaluators plus evaluators of the application's
database state. Pure functions of their inputs (stdlib and sqlite3 only).

A task's `eval` object (WebArena's format, extended):

    {
      "eval_types": ["string_match", "url_match", "db_query", "db_diff"],   # AND-ed, in this order
      "reference_answers": {                 # string_match
        "exact_match": "alice",              #   the whole answer, case-insensitive, quotes stripped
        "must_include": ["42", "closed"],    #   every phrase appears in the answer, case-insensitive
        "fuzzy_match": ["three tickets"],    #   or "N/A": see below
        "must_exclude": ["#40"]              #   none of these is named (cua_jax's, not WebArena's)
      },
      "string_note": "...",                  # why the task is unachievable, for "N/A" tasks
      "reference_url": "/report/3 |OR| /query?milestone=1.0",   # url_match
      "url_note": "GOLD in PRED",
      "db_query": [{"sql": "SELECT status FROM ticket WHERE id=5", "expected": [["closed"]],
                    "ordered": false}],      # or one such object
      "db_diff": {"must": [change, ...], "may": [pattern, ...]}
    }

string_match follows WebArena: answers are stripped of surrounding quotes and lowercased;
`exact_match` compares whole strings; `must_include` checks each phrase is a substring (a
one-character phrase, alone in its list, must be a whole token, as WebArena's tokenised check).
`must_exclude` (not WebArena's) names phrases the answer must not name as a whole, so that an
answer listing every candidate cannot pass a `must_include`. WebArena's `fuzzy_match` asks an
LLM; here it is deterministic and stricter: after normalisation (Unicode NFKC, lowercase,
punctuation dropped except inside numbers, articles dropped, number words zero..twenty as
digits, whitespace collapsed) the answer must equal a reference. A reference of "N/A" (an
unachievable task) accepts the answer "N/A", alone or followed by a reason; WebArena's
LLM judge of that reason is not reproduced.

url_match follows WebArena's "GOLD in PRED" rule: some reference's path (trailing "/" dropped) is
a substring of the final page's path, and for every query parameter the references name, the
final page has one of the values they give it. Paths are relative to the site root.

db_query runs the task's SQL on the episode's database opened read-only and compares the rows
(lists of values) with `expected`, as a multiset unless `ordered` is true.

db_diff computes the row-level difference between the seeded base database and the episode's
database over every table except EPHEMERAL_TABLES (what a mere page view writes). Rows are matched
by the table's primary key, else its first UNIQUE constraint, else the whole row. Each difference
is an insert (a new key), a delete (a key gone) or an update (a key whose other columns changed).

    change  = {"table": "ticket", "op": "insert"|"update"|"delete", "where": {col: value},
               "set": {col: value}}
    pattern = {"table": "ticket_change", "op": "insert"|"update"|"delete", "where": {col: value},
               "columns": [col, ...]}

A `must` change must happen: an insert whose new row matches `where` and `set`, a delete whose old
row matches `where`, an update whose old row matches `where` and new row matches `set`. A `may`
pattern allows a difference without requiring it: rows matching `where` (the new row of an insert,
the old row of an update or delete); for updates, `columns` lists the columns that may change
(absent: any). Every difference must be allowed, every changed column of an update by a `must`
(its `set` columns) or a `may` (its `columns`), else it fails as collateral damage, named. Only
the columns a spec names are compared, so timestamps are ignored unless named. A value in `where`
or `set` is compared for equality (an integer and its decimal string are equal), or is an object
{"contains": "text"}: the column's text contains that text. NULL and "" are equal (a web form
cannot tell them apart).

The judge never interpolates database content into SQL: the episode's database is opened
read-only through a URI, identifiers come from its schema and are quoted, values are bound.
"""

import collections
import json
import os
import re
import sqlite3
import unicodedata
import urllib.parse
from dataclasses import dataclass
from typing import Any

EVAL_TYPES = ("string_match", "url_match", "db_query", "db_diff")

# Tables a page view (session, form-token cookie, cache generations) or a log-in writes to; no
# part of the application's content. Found by diffing the database after browsing every kind of
# page with a fresh browser.
EPHEMERAL_TABLES = frozenset({"session", "session_attribute", "auth_cookie", "cache"})

DIFF_OPS = ("insert", "update", "delete")


@dataclass(frozen=True)
class Verdict:
    """score is 1.0 when every check passed, else 0.0; reasons names every failed check."""

    score: float
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class RowChange:
    """One row-level difference between the base and the episode's database."""

    table: str
    op: str  # "insert" | "update" | "delete"
    old: dict | None  # the base row (update, delete)
    new: dict | None  # the episode's row (insert, update)

    @property
    def changed_columns(self) -> tuple[str, ...]:
        if self.op != "update":
            return ()
        return tuple(c for c in self.new if not _same_value(self.old.get(c), self.new[c]))

    def describe(self) -> str:
        row = self.new if self.op == "insert" else self.old
        shown = {k: _short(v) for k, v in row.items()}
        if self.op == "update":
            changed = {c: f"{_short(self.old[c])} -> {_short(self.new[c])}" for c in self.changed_columns}
            return f"update {self.table} {shown}: {changed}"
        return f"{self.op} {self.table} {shown}"


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > 60:
        return value[:57] + "..."
    return value


# ---------------------------------------------------------------------------------- string_match

_NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()


def clean_answer(answer: str) -> str:
    """WebArena's StringEvaluator.clean_answer: strip, drop one pair of surrounding quotes, lowercase."""
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"":
        answer = answer[1:-1]
    return answer.lower()


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text)


def exact_match(reference: str, answer: str) -> bool:
    return clean_answer(answer) == clean_answer(reference)


def must_include(reference: str, answer: str, tokenize: bool) -> bool:
    ref, pred = clean_answer(reference), clean_answer(answer)
    if tokenize and len(ref) == 1 and len(_tokens(ref)) == 1:
        return ref in _tokens(pred)
    return ref in pred


def names_phrase(phrase: str, answer: str) -> bool:
    """Whether `answer` names `phrase` as a whole (case-insensitive, not inside a longer word or
    number: "#4" is not named by "#40")."""
    pattern = r"(?<![\w])" + re.escape(clean_answer(phrase)) + r"(?![\w])"
    return re.search(pattern, clean_answer(answer)) is not None


def normalize_for_fuzzy(text: str) -> str:
    text = unicodedata.normalize("NFKC", clean_answer(text))
    # Drop punctuation except a '.' or ',' between digits (3.5, 1,000) and '-'/'/' inside words.
    text = re.sub(r"(?<!\d)[.,](?!\d)|[.,](?=\s|$)", " ", text)
    text = re.sub(r"[^\w\s.,/#-]", " ", text)
    words = []
    for word in text.split():
        word = word.strip("-/")
        if word in ("a", "an", "the", ""):
            continue
        words.append(str(_NUMBER_WORDS.index(word)) if word in _NUMBER_WORDS else word)
    return " ".join(words)


def fuzzy_match(reference: str, answer: str) -> bool:
    """The deterministic stand-in for WebArena's LLM fuzzy match (module docstring)."""
    return normalize_for_fuzzy(answer) == normalize_for_fuzzy(reference)


def _is_na_answer(answer: str) -> bool:
    pred = clean_answer(answer)
    return pred == "n/a" or (pred.startswith("n/a") and not pred[3].isalnum())


def judge_string_match(spec: dict, answer: str | None) -> list[str]:
    if answer is None:
        return ["string_match: the episode ended without an answer"]
    failures = []
    for approach, value in spec["reference_answers"].items():
        if approach == "exact_match":
            if not exact_match(value, answer):
                failures.append(f"string_match: answer {answer!r} is not exactly {value!r}")
        elif approach == "must_include":
            for phrase in value:
                if not must_include(phrase, answer, tokenize=len(value) == 1):
                    failures.append(f"string_match: answer {answer!r} does not include {phrase!r}")
        elif approach == "must_exclude":
            for phrase in value:
                if names_phrase(phrase, answer):
                    failures.append(f"string_match: answer {answer!r} names {phrase!r}, which is not an answer")
        elif approach == "fuzzy_match":
            if value == "N/A":
                if not _is_na_answer(answer):
                    failures.append(f"string_match: answer {answer!r} is not N/A")
            else:
                for reference in value:
                    if not fuzzy_match(reference, answer):
                        failures.append(f"string_match: answer {answer!r} does not match {reference!r}")
    return failures


# ------------------------------------------------------------------------------------- url_match


def _split_url(url: str) -> tuple[str, dict[str, list[str]]]:
    parsed = urllib.parse.urlparse(url)
    return parsed.path.rstrip("/"), urllib.parse.parse_qs(parsed.query)


def judge_url_match(spec: dict, final_url_path: str | None) -> list[str]:
    if final_url_path is None:
        return ["url_match: the episode has no final page"]
    rule = spec.get("url_note", "GOLD in PRED")
    if rule != "GOLD in PRED":
        raise ValueError(f"url_match: unknown url_note {rule!r} (only 'GOLD in PRED' is defined)")
    pred_path, pred_query = _split_url(final_url_path)
    ref_paths = []
    ref_query: dict[str, set[str]] = collections.defaultdict(set)
    for reference in spec["reference_url"].split(" |OR| "):
        path, query = _split_url(reference.strip())
        ref_paths.append(path)
        for key, values in query.items():
            ref_query[key].update(values)
    failures = []
    if not any(path in pred_path for path in ref_paths):
        failures.append(f"url_match: final page {final_url_path!r} is not on any of {ref_paths}")
    for key, values in sorted(ref_query.items()):
        if not any(v in pred_query.get(key, []) for v in values):
            failures.append(f"url_match: final page {final_url_path!r} lacks {key}= one of {sorted(values)}")
    return failures


# -------------------------------------------------------------------------------------- database


def open_read_only(db_path: str) -> sqlite3.Connection:
    """The database at db_path, read-only (a URI with mode=ro, and query_only): a judge never writes."""
    if not os.path.isfile(db_path):
        raise FileNotFoundError(f"no database at {db_path}")
    uri = "file:" + urllib.parse.quote(os.path.abspath(db_path)) + "?mode=ro"
    db = sqlite3.connect(uri, uri=True)
    db.execute("PRAGMA query_only = ON")
    return db


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _same_value(a: Any, b: Any) -> bool:
    if a == b:
        return True
    # A web form cannot tell an empty field from NULL (Trac writes either for a cleared field).
    if a is None and b == "" or a == "" and b is None:
        return True
    # An integer column and a JSON string of its digits (or the reverse) name the same value.
    if isinstance(a, int) and isinstance(b, str) or isinstance(a, str) and isinstance(b, int):
        return str(a) == str(b)
    return False


def _value_matches(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if set(wanted) != {"contains"}:
            raise ValueError(f"a value matcher is a plain value or {{'contains': text}}, not {wanted!r}")
        return isinstance(actual, str) and wanted["contains"] in actual
    return _same_value(actual, wanted)


def _row_matches(row: dict, wanted: dict) -> bool:
    return all(col in row and _value_matches(row[col], value) for col, value in wanted.items())


def judge_db_query(spec: dict | list, branch_db: str) -> list[str]:
    queries = spec if isinstance(spec, list) else [spec]
    failures = []
    db = open_read_only(branch_db)
    try:
        for query in queries:
            rows = [list(r) for r in db.execute(query["sql"]).fetchall()]
            expected = [list(r) for r in query["expected"]]
            if query.get("ordered", False):
                ok = len(rows) == len(expected) and all(
                    len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b)) for a, b in zip(rows, expected)
                )
            else:
                ok = _same_multiset(rows, expected)
            if not ok:
                failures.append(f"db_query: {query['sql']!r} gave {_short(repr(rows))}, expected {expected!r}")
    finally:
        db.close()
    return failures


def _same_multiset(rows: list[list], expected: list[list]) -> bool:
    """Multiset equality of rows under _same_value (small result sets: a greedy pairing suffices,
    as _same_value is an equivalence on the values a query returns)."""
    if len(rows) != len(expected):
        return False
    left = list(expected)
    for row in rows:
        for i, candidate in enumerate(left):
            if len(candidate) == len(row) and all(_same_value(x, y) for x, y in zip(row, candidate)):
                del left[i]
                break
        else:
            return False
    return not left


def _table_key(db: sqlite3.Connection, schema: str, table: str) -> tuple[str, ...]:
    """The table's primary key columns, else its first UNIQUE constraint's, else () (whole row)."""
    info = db.execute(f"PRAGMA {schema}.table_info({_quote(table)})").fetchall()
    pk = [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5] > 0]
    if pk:
        return tuple(pk)
    for index in db.execute(f"PRAGMA {schema}.index_list({_quote(table)})").fetchall():
        # (seq, name, unique, origin, partial): origin 'u' is a UNIQUE constraint of the table.
        if index[2] and index[3] == "u":
            cols = db.execute(f"PRAGMA {schema}.index_info({_quote(index[1])})").fetchall()
            return tuple(r[2] for r in sorted(cols))
    return ()


def _tables(db: sqlite3.Connection, schema: str) -> dict[str, tuple[str, ...]]:
    names = db.execute(
        f"SELECT name FROM {schema}.sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return {
        name: tuple(r[1] for r in db.execute(f"PRAGMA {schema}.table_info({_quote(name)})").fetchall())
        for (name,) in names
    }


def diff_databases(base_db: str, branch_db: str) -> list[RowChange]:
    """Every row-level difference from base_db to branch_db outside EPHEMERAL_TABLES, in table
    order. The set differences are computed by SQLite (EXCEPT) so a large database is not read
    into Python; only the differing rows are."""
    db = open_read_only(branch_db)
    try:
        base_uri = "file:" + urllib.parse.quote(os.path.abspath(base_db)) + "?mode=ro"
        if not os.path.isfile(base_db):
            raise FileNotFoundError(f"no database at {base_db}")
        db.execute("ATTACH DATABASE ? AS base", (base_uri,))
        branch_tables, base_tables = _tables(db, "main"), _tables(db, "base")
        changes: list[RowChange] = []
        for table in sorted(set(branch_tables) | set(base_tables)):
            if table in EPHEMERAL_TABLES:
                continue
            if table in branch_tables and table in base_tables and branch_tables[table] != base_tables[table]:
                raise ValueError(
                    f"db_diff: table {table} has columns {base_tables[table]} in the base and"
                    f" {branch_tables[table]} in the episode's database"
                )
            columns = branch_tables.get(table) or base_tables[table]
            cols = ", ".join(_quote(c) for c in columns)
            qt = _quote(table)

            def rows(sql: str, columns=columns) -> list[dict]:
                return [dict(zip(columns, r)) for r in db.execute(sql)]

            if table not in base_tables:
                changes += [RowChange(table, "insert", None, r) for r in rows(f"SELECT {cols} FROM main.{qt}")]
                continue
            if table not in branch_tables:
                changes += [RowChange(table, "delete", r, None) for r in rows(f"SELECT {cols} FROM base.{qt}")]
                continue
            key = _table_key(db, "main", table)
            if not key:
                changes += _keyless_changes(db, table, columns)
                continue
            added = rows(f"SELECT {cols} FROM main.{qt} EXCEPT SELECT {cols} FROM base.{qt}")
            removed = rows(f"SELECT {cols} FROM base.{qt} EXCEPT SELECT {cols} FROM main.{qt}")
            removed_by_key = {tuple(r[k] for k in key): r for r in removed}
            for row in added:
                old = removed_by_key.pop(tuple(row[k] for k in key), None)
                changes.append(RowChange(table, "update", old, row) if old else RowChange(table, "insert", None, row))
            changes += [RowChange(table, "delete", r, None) for r in removed_by_key.values()]
        return changes
    finally:
        db.close()


def _keyless_changes(db: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> list[RowChange]:
    """Inserts and deletes of a table without a key, by the multiplicity of each whole row."""
    cols = ", ".join(_quote(c) for c in columns)
    qt = _quote(table)
    same_row = " AND ".join(f"{_quote(c)} IS ?" for c in columns)
    out = []
    for schema, other, op in (("main", "base", "insert"), ("base", "main", "delete")):
        counted = (
            f"SELECT {cols}, count(*) FROM {schema}.{qt} GROUP BY {cols}"
            f" EXCEPT SELECT {cols}, count(*) FROM {other}.{qt} GROUP BY {cols}"
        )
        for r in db.execute(counted).fetchall():
            values, count = r[:-1], r[-1]
            other_count = db.execute(f"SELECT count(*) FROM {other}.{qt} WHERE {same_row}", values).fetchone()[0]
            row = dict(zip(columns, values))
            for _ in range(count - other_count):
                out.append(RowChange(table, op, row if op == "delete" else None, row if op == "insert" else None))
    return out


def _change_matches_must(change: RowChange, must: dict) -> bool:
    if change.table != must["table"] or change.op != must["op"]:
        return False
    where, wanted = must.get("where", {}), must.get("set", {})
    if change.op == "insert":
        return _row_matches(change.new, where) and _row_matches(change.new, wanted)
    if change.op == "delete":
        return _row_matches(change.old, where)
    return _row_matches(change.old, where) and _row_matches(change.new, wanted)


def _change_matches_may(change: RowChange, may: dict) -> bool:
    if change.table != may["table"] or change.op != may["op"]:
        return False
    return _row_matches(change.new if change.op == "insert" else change.old, may.get("where", {}))


def judge_db_diff(spec: dict, branch_db: str, base_db: str) -> list[str]:
    changes = diff_databases(base_db, branch_db)
    musts, mays = spec.get("must", []), spec.get("may", [])
    failures = []
    for must in musts:
        if not any(_change_matches_must(c, must) for c in changes):
            failures.append(f"db_diff: required change did not happen: {json.dumps(must, sort_keys=True)}")
    for change in changes:
        matching_musts = [m for m in musts if _change_matches_must(change, m)]
        matching_mays = [m for m in mays if _change_matches_may(change, m)]
        if change.op != "update":
            if not matching_musts and not matching_mays:
                failures.append(f"db_diff: collateral change: {change.describe()}")
            continue
        allowed: set[str] = set()
        any_column = False
        for m in matching_musts:
            allowed.update(m.get("set", {}))
        for m in matching_mays:
            if "columns" in m:
                allowed.update(m["columns"])
            else:
                any_column = True
        uncovered = [c for c in change.changed_columns if c not in allowed]
        if uncovered and not any_column:
            failures.append(f"db_diff: collateral change of {uncovered}: {change.describe()}")
    return failures


# ------------------------------------------------------------------------------------ the router


def validate_eval(spec: Any, where: str) -> None:
    """Raise ValueError naming `where` (a task file or id) and the bad field of a malformed eval."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: field 'eval' must be an object")
    types = spec.get("eval_types")
    if not isinstance(types, list) or not types:
        raise ValueError(f"{where}: field 'eval.eval_types' must be a non-empty list")
    for eval_type in types:
        if eval_type not in EVAL_TYPES:
            raise ValueError(f"{where}: unknown eval type {eval_type!r} in 'eval.eval_types' (known: {EVAL_TYPES})")
    if "string_match" in types:
        refs = spec.get("reference_answers")
        if not isinstance(refs, dict) or not refs:
            raise ValueError(f"{where}: field 'eval.reference_answers' must be a non-empty object")
        for approach, value in refs.items():
            if approach == "exact_match" and not isinstance(value, str):
                raise ValueError(f"{where}: field 'eval.reference_answers.exact_match' must be a string")
            elif approach in ("must_include", "must_exclude", "fuzzy_match"):
                ok = isinstance(value, list) and value and all(isinstance(v, str) for v in value)
                if not ok and not (approach == "fuzzy_match" and value == "N/A"):
                    raise ValueError(f"{where}: field 'eval.reference_answers.{approach}' must be a list of strings")
            elif approach not in ("exact_match", "must_include", "must_exclude", "fuzzy_match"):
                raise ValueError(f"{where}: unknown field 'eval.reference_answers.{approach}'")
    if "url_match" in types:
        if not isinstance(spec.get("reference_url"), str) or not spec["reference_url"].strip():
            raise ValueError(f"{where}: field 'eval.reference_url' must be a non-empty string")
        if spec.get("url_note", "GOLD in PRED") != "GOLD in PRED":
            raise ValueError(f"{where}: field 'eval.url_note' must be 'GOLD in PRED'")
    if "db_query" in types:
        queries = spec.get("db_query")
        queries = queries if isinstance(queries, list) else [queries]
        for i, q in enumerate(queries):
            if not isinstance(q, dict) or not isinstance(q.get("sql"), str) or not isinstance(q.get("expected"), list):
                raise ValueError(f"{where}: field 'eval.db_query[{i}]' needs 'sql' (string) and 'expected' (list)")
            if not all(isinstance(r, list) for r in q["expected"]):
                raise ValueError(f"{where}: field 'eval.db_query[{i}].expected' must be a list of rows (lists)")
    if "db_diff" in types:
        diff = spec.get("db_diff")
        if not isinstance(diff, dict) or set(diff) - {"must", "may"}:
            raise ValueError(f"{where}: field 'eval.db_diff' must be an object with 'must' and/or 'may'")
        item_keys = {"must": {"table", "op", "where", "set"}, "may": {"table", "op", "where", "columns"}}
        for part, allowed_keys in item_keys.items():
            for i, item in enumerate(diff.get(part, [])):
                field = f"eval.db_diff.{part}[{i}]"
                if not isinstance(item, dict) or set(item) - allowed_keys:
                    raise ValueError(f"{where}: field '{field}' may only have keys {sorted(allowed_keys)}")
                if not isinstance(item.get("table"), str) or item.get("op") not in DIFF_OPS:
                    raise ValueError(f"{where}: field '{field}' needs 'table' and 'op' in {DIFF_OPS}")
                if item["table"] in EPHEMERAL_TABLES:
                    raise ValueError(f"{where}: field '{field}' names ephemeral table {item['table']!r}")
                for sub in ("where", "set"):
                    if not isinstance(item.get(sub, {}), dict):
                        raise ValueError(f"{where}: field '{field}.{sub}' must be an object")
                if "columns" in item and not (
                    isinstance(item["columns"], list) and all(isinstance(c, str) for c in item["columns"])
                ):
                    raise ValueError(f"{where}: field '{field}.columns' must be a list of column names")


def judge(task: dict, answer: str | None, final_url_path: str | None, branch_db: str, base_db: str) -> Verdict:
    """Score a finished episode of `task` (a parsed task file): every evaluator of
    task['eval']['eval_types'], AND-ed in order; reasons name every failed check."""
    where = f"task {task.get('task_id', '<no task_id>')}"
    spec = task.get("eval")
    validate_eval(spec, where)
    failures: list[str] = []
    for eval_type in spec["eval_types"]:
        if eval_type == "string_match":
            failures += judge_string_match(spec, answer)
        elif eval_type == "url_match":
            failures += judge_url_match(spec, final_url_path)
        elif eval_type == "db_query":
            failures += judge_db_query(spec["db_query"], branch_db)
        elif eval_type == "db_diff":
            failures += judge_db_diff(spec["db_diff"], branch_db, base_db)
    return Verdict(score=0.0 if failures else 1.0, reasons=tuple(failures))
