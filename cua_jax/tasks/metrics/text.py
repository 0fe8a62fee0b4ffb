"""Metrics on strings and text files (OSWorld's general.py and vscode.py text checks)."""

from __future__ import annotations

import difflib
import re
from typing import Any

from cua_jax.tasks.metrics.base import (
    JudgeError,
    fuzzy_ratio,
    metric,
    read_expected_text,
    read_text,
    rule,
)

# ------------------------------------------------------------------------------------
# Values against rules
# ------------------------------------------------------------------------------------


@metric()
def exact_match(result: Any, rules: dict, **_) -> float:
    """1 when the result equals rules['expected'] exactly."""
    return float(result is not None and result == rule(rules, "expected"))


@metric()
def match_in_list(result: Any, rules: dict) -> float:
    """1 when the result is one of rules['expected'] (a list of accepted values)."""
    accepted = rule(rules, "expected")
    if not isinstance(accepted, (list, tuple, str)):
        raise JudgeError(f"match_in_list needs rules['expected'] to be a list, got {accepted!r}")
    return float(result is not None and result in accepted)


@metric()
def is_in_list(result: Any, rules: dict) -> float:
    """1 when rules['expected'] is an element (or, for text, a substring) of the result."""
    wanted = rule(rules, "expected")
    if not isinstance(result, (list, tuple, set, str, dict)):
        return 0.0
    try:
        return float(wanted in result)
    except TypeError:  # a non-string looked up in a string
        return 0.0


@metric()
def literal_match(result: Any, expected: Any, type: str = "str", ignore_case: bool = False) -> float:
    """The two getter values compared as text: `type` "str" compares str(result) with
    str(expected); "list" compares two equally long lists element-wise as strings."""
    if result is None:
        return 0.0

    def norm(value: Any) -> str:
        return str(value).lower() if ignore_case else str(value)

    if type == "str":
        return float(norm(result) == norm(expected))
    if type == "list":
        if not isinstance(result, (list, tuple)) or not isinstance(expected, (list, tuple)):
            return 0.0
        return float(len(result) == len(expected) and [norm(v) for v in result] == [norm(v) for v in expected])
    raise JudgeError(f"literal_match option type={type!r} is not 'str' or 'list'")


@metric()
def check_include_exclude(result: Any, rules: dict, **_) -> float:
    """1 when the text contains every rules['include'] string and no rules['exclude'] one."""
    if result is None:
        return 0.0
    if not isinstance(rules, dict):
        raise JudgeError(f"check_include_exclude needs rules with 'include' / 'exclude', got {rules!r}")
    text = str(result)
    include, exclude = rules.get("include", []), rules.get("exclude", [])
    return float(all(s in text for s in include) and not any(s in text for s in exclude))


@metric()
def fuzzy_match(result: Any, rules: dict) -> float:
    """The Indel similarity ratio (rapidfuzz) of the result and rules['expected'], in [0, 1]."""
    expected = rule(rules, "expected")
    if result is None:
        return 0.0
    return fuzzy_ratio(str(result), str(expected))


@metric()
def compare_answer(result: Any, rules: dict, **_) -> float:
    """1 when a non-empty result equals rules['expected']."""
    expected = rule(rules, "expected")
    return float(bool(result) and result == expected)


@metric()
def is_extension_installed(result: Any, rules: dict, **_) -> float:
    """rules {"type": "contain" | "not_contain", "expected": text}: whether the result
    (e.g. a list of installed extensions) contains the expected text."""
    kind, wanted = rule(rules, "type"), rule(rules, "expected")
    if kind not in ("contain", "not_contain"):
        raise JudgeError(f"is_extension_installed rule type {kind!r} is not 'contain' or 'not_contain'")
    if result is None:
        return 0.0
    return float((wanted in result) == (kind == "contain"))


# ------------------------------------------------------------------------------------
# Text files
# ------------------------------------------------------------------------------------


def sequence_ratio(a: list, b: list) -> float:
    """difflib's similarity ratio 2M / (len(a) + len(b)) of two sequences (1 for two empty)."""
    return difflib.SequenceMatcher(a=a, b=b, autojunk=False).ratio()


@metric()
def diff_text_file(result_path: str | None, expected_path: str) -> float:
    """The line-level similarity ratio (difflib) of two text files, in [0, 1]."""
    expected = read_expected_text(expected_path)
    result = read_text(result_path)
    if result is None:
        return 0.0
    return sequence_ratio(result.splitlines(), expected.splitlines())


def _blanks_collapsed(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@metric()
def compare_text_file(
    result_path: str | None, expected_path: str | None, ignore_blanks: bool = False, ignore_case: bool = False, **_
) -> float:
    """1 when two text files hold the same text (optionally with every whitespace run
    collapsed to one space and the ends stripped, and / or ignoring case)."""
    expected = read_expected_text(expected_path)
    result = read_text(result_path)
    if result is None:
        return 0.0
    if ignore_blanks:
        result, expected = _blanks_collapsed(result), _blanks_collapsed(expected)
    if ignore_case:
        result, expected = result.lower(), expected.lower()
    return float(result == expected)


@metric()
def check_list(result_path: str | None, rules: dict) -> float:
    """1 when every rules['expect'] regex matches some line of the file and no
    rules['unexpect'] regex matches any line."""
    if not isinstance(rules, dict):
        raise JudgeError(f"check_list needs rules with 'expect' / 'unexpect' regexes, got {rules!r}")
    try:
        expect = [re.compile(p) for p in rules.get("expect", [])]
        unexpect = [re.compile(p) for p in rules.get("unexpect", [])]
    except (re.error, TypeError) as error:
        raise JudgeError(f"check_list has a bad regular expression: {error}") from None
    text = read_text(result_path)
    if text is None:
        return 0.0
    lines = text.splitlines()
    found = all(any(p.search(line) for line in lines) for p in expect)
    return float(found and not any(p.search(line) for p in unexpect for line in lines))


@metric()
def file_contains(result_path: str | None, rules: dict) -> float:
    """1 when the file contains every string of rules['expected']."""
    wanted = rule(rules, "expected")
    if isinstance(wanted, str) or not isinstance(wanted, list):
        raise JudgeError(f"file_contains needs rules['expected'] to be a list of strings, got {wanted!r}")
    text = read_text(result_path)
    return float(text is not None and all(s in text for s in wanted))


_CLOCK_TIME = re.compile(r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)")


@metric()
def check_line_number(result_path: str | None, rules: dict) -> float:
    """1 when the number of lines holding a clock time (HH:MM:SS) is int(rules['expected'])."""
    try:
        wanted = int(rule(rules, "expected"))
    except (TypeError, ValueError):
        raise JudgeError(f"check_line_number needs an integer rules['expected'], got {rules!r}") from None
    text = read_text(result_path)
    if text is None:
        return 0.0
    return float(sum(1 for line in text.splitlines() if _CLOCK_TIME.search(line)) == wanted)


@metric()
def compare_terminal_and_txt(txt_path: str | None, terminal_output: Any) -> float:
    """1 when a terminal's output equals the text file's content exactly."""
    text = read_text(txt_path)
    return float(text is not None and bool(terminal_output) and terminal_output == text)


def python_source_normalised(text: str) -> str:
    """Python source without a shebang / coding line among its first three lines, blank
    lines, trailing spaces; tabs expanded to 4 columns."""
    lines = text.splitlines()
    start = 0
    while start < min(len(lines), 3):
        head = lines[start].strip()
        if head.startswith(("#!", "# -*- coding:", "# coding:", "# coding=")):
            start += 1
            continue
        break
    return "\n".join(line.expandtabs(4).rstrip() for line in lines[start:] if line.strip())


@metric()
def compare_python_pure_text(result_path: str | None, expected_path: str) -> float:
    """1 when two Python files are the same source up to blank lines, trailing spaces,
    tabs and a leading shebang / coding line."""
    expected = read_expected_text(expected_path)
    result = read_text(result_path)
    if result is None:
        return 0.0
    return float(python_source_normalised(result) == python_source_normalised(expected))


@metric()
def compare_result_files(result_path: str | None, expected_path: str) -> float:
    """1 when two files hold the same answer: when the expected file holds a number, the
    result contains that text or holds a number within 1e-4 of it; otherwise both texts
    are equal (surrounding blanks ignored)."""
    expected = read_expected_text(expected_path).strip()
    result = read_text(result_path)
    if result is None:
        return 0.0
    result = result.strip()
    try:
        target = float(expected)
    except ValueError:
        return float(result == expected)
    if expected in result:
        return 1.0
    try:
        return float(abs(float(result) - target) < 1e-4)
    except ValueError:
        return 0.0
