"""Text metrics: values against rules and text files, right (1) and wrong (0)."""

import difflib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cua_jax.tasks.metrics import JudgeError
from cua_jax.tasks.metrics import text as T


def write(path, content):
    path.write_text(content)
    return str(path)


def test_exact_match_match_in_list_is_in_list():
    assert T.exact_match("abc", {"expected": "abc"}) == 1.0
    assert T.exact_match("abd", {"expected": "abc"}) == 0.0
    assert T.match_in_list("b", {"expected": ["a", "b"]}) == 1.0
    assert T.match_in_list("c", {"expected": ["a", "b"]}) == 0.0
    assert T.match_in_list(None, {"expected": ["a"]}) == 0.0
    with pytest.raises(JudgeError, match="list"):
        T.match_in_list("a", {"expected": 3})
    assert T.is_in_list(["x", "y"], {"expected": "y"}) == 1.0
    assert T.is_in_list(["x"], {"expected": "y"}) == 0.0
    assert T.is_in_list("a long text", {"expected": "long"}) == 1.0
    assert T.is_in_list(None, {"expected": "y"}) == 0.0
    with pytest.raises(JudgeError, match="need 'expected'"):
        T.is_in_list(["x"], {})


def test_literal_match_types_and_case():
    assert T.literal_match(3, "3") == 1.0
    assert T.literal_match("Abc", "abc") == 0.0
    assert T.literal_match("Abc", "abc", ignore_case=True) == 1.0
    assert T.literal_match(["A", 1], ["a", "1"], type="list", ignore_case=True) == 1.0
    assert T.literal_match(["A", 1], ["A"], type="list") == 0.0
    assert T.literal_match("A", ["A"], type="list") == 0.0
    assert T.literal_match(None, "None") == 0.0
    with pytest.raises(JudgeError, match="type='dict'"):
        T.literal_match("a", "a", type="dict")


def test_check_include_exclude_and_fuzzy_match():
    rules = {"include": ["a", "b"], "exclude": ["z"]}
    assert T.check_include_exclude("xaby", rules) == 1.0
    assert T.check_include_exclude("xabz", rules) == 0.0
    assert T.fuzzy_match("kitten", {"expected": "kitten"}) == 1.0
    assert T.fuzzy_match("abc", {"expected": "xyz"}) == 0.0
    assert 0.0 < T.fuzzy_match("kitten", {"expected": "sitting"}) < 1.0
    assert T.fuzzy_match(None, {"expected": "x"}) == 0.0


def test_compare_answer_and_extension_installed():
    assert T.compare_answer("42", {"expected": "42"}) == 1.0
    assert T.compare_answer("41", {"expected": "42"}) == 0.0
    assert T.compare_answer("", {"expected": ""}) == 0.0  # an empty answer is no answer
    installed = "ms-python.python\nesbenp.prettier-vscode\n"
    assert T.is_extension_installed(installed, {"type": "contain", "expected": "ms-python.python"}) == 1.0
    assert T.is_extension_installed(installed, {"type": "not_contain", "expected": "ms-python.python"}) == 0.0
    assert T.is_extension_installed(installed, {"type": "not_contain", "expected": "rust"}) == 1.0
    with pytest.raises(JudgeError, match="'contain' or 'not_contain'"):
        T.is_extension_installed(installed, {"type": "maybe", "expected": "x"})


def test_diff_text_file_is_difflib_line_ratio(tmp_path):
    expected = write(tmp_path / "e.txt", "a\nb\nc\nd\n")
    assert T.diff_text_file(write(tmp_path / "same.txt", "a\nb\nc\nd"), expected) == 1.0
    assert T.diff_text_file(write(tmp_path / "other.txt", "w\nx\ny\nz\n"), expected) == 0.0
    assert T.diff_text_file(write(tmp_path / "half.txt", "a\nb\nx\ny\n"), expected) == 0.5
    assert T.diff_text_file(None, expected) == 0.0
    with pytest.raises(JudgeError, match="expected file"):
        T.diff_text_file(expected, str(tmp_path / "missing.txt"))


@given(st.lists(st.sampled_from(["a", "b", "c"]), max_size=8), st.lists(st.sampled_from(["a", "b", "c"]), max_size=8))
def test_sequence_ratio_matches_difflib_and_is_symmetric_in_range(a, b):
    ratio = T.sequence_ratio(a, b)
    assert ratio == difflib.SequenceMatcher(a=a, b=b, autojunk=False).ratio()
    assert 0.0 <= ratio <= 1.0
    assert T.sequence_ratio(a, a) == 1.0


def test_compare_text_file_options(tmp_path):
    expected = write(tmp_path / "e.txt", "Hello world")
    assert T.compare_text_file(write(tmp_path / "a.txt", "Hello world"), expected) == 1.0
    other = write(tmp_path / "b.txt", " hello\t\nWORLD ")
    assert T.compare_text_file(other, expected) == 0.0
    assert T.compare_text_file(other, expected, ignore_blanks=True) == 0.0
    assert T.compare_text_file(other, expected, ignore_blanks=True, ignore_case=True) == 1.0


def test_check_list_regexes_per_line(tmp_path):
    path = write(tmp_path / "list.txt", "apple 3\nbanana 5\n")
    assert T.check_list(path, {"expect": [r"^apple \d$", "banana"], "unexpect": ["cherry"]}) == 1.0
    assert T.check_list(path, {"expect": ["cherry"]}) == 0.0
    assert T.check_list(path, {"unexpect": ["ban"]}) == 0.0
    assert T.check_list(None, {"expect": []}) == 0.0
    with pytest.raises(JudgeError, match="bad regular expression"):
        T.check_list(path, {"expect": ["("]})


def test_file_contains_and_line_number(tmp_path):
    path = write(tmp_path / "log.txt", "12:00:01 start\nnothing\n23:59:60 end\n")
    assert T.file_contains(path, {"expected": ["start", "end"]}) == 1.0
    assert T.file_contains(path, {"expected": ["start", "middle"]}) == 0.0
    with pytest.raises(JudgeError, match="list of strings"):
        T.file_contains(path, {"expected": "start"})
    assert T.check_line_number(path, {"expected": "2"}) == 1.0
    assert T.check_line_number(path, {"expected": 3}) == 0.0
    assert T.check_line_number(None, {"expected": 0}) == 0.0


def test_compare_terminal_and_txt(tmp_path):
    path = write(tmp_path / "out.txt", "line\n")
    assert T.compare_terminal_and_txt(path, "line\n") == 1.0
    assert T.compare_terminal_and_txt(path, "line") == 0.0
    assert T.compare_terminal_and_txt(path, "") == 0.0


def test_compare_python_pure_text(tmp_path):
    gold = write(tmp_path / "gold.py", "def f():\n    return 1\n")
    same = write(tmp_path / "a.py", "#!/usr/bin/env python\n# coding: utf-8\n\ndef f():   \n\treturn 1\n\n")
    assert T.compare_python_pure_text(same, gold) == 1.0
    assert T.compare_python_pure_text(write(tmp_path / "b.py", "```python\ndef f():\n    return 1\n```"), gold) == 0.0


def test_compare_result_files_numbers_and_text(tmp_path):
    number = write(tmp_path / "n.txt", "3.14159\n")
    assert T.compare_result_files(write(tmp_path / "a.txt", "3.141591"), number) == 1.0
    assert T.compare_result_files(write(tmp_path / "b.txt", "The answer is 3.14159."), number) == 1.0
    assert T.compare_result_files(write(tmp_path / "c.txt", "3.2"), number) == 0.0
    word = write(tmp_path / "w.txt", "pear")
    assert T.compare_result_files(write(tmp_path / "d.txt", " pear\n"), word) == 1.0
    assert T.compare_result_files(write(tmp_path / "e.txt", "plum"), word) == 0.0
