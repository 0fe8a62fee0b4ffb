"""Metrics, host-side getters, downloads and the verdict combination of the judges."""

import functools
import http.server
import json
import threading

import pytest

from cua_jax.envs import actions as A
from cua_jax.tasks import judges
from cua_jax.tasks.schema import Step, parse_task


def write(path, text):
    path.write_text(text)
    return str(path)


def test_exact_match_and_include_exclude():
    assert judges.exact_match("abc", {"expected": "abc"}) == 1.0
    assert judges.exact_match("abc\n", {"expected": "abc"}) == 0.0
    assert judges.exact_match(None, {"expected": None}) == 0.0
    with pytest.raises(judges.JudgeError, match="need 'expected'"):
        judges.exact_match("abc", {"wanted": "abc"})
    rules = {"include": ["a", "b"], "exclude": ["z"]}
    assert judges.check_include_exclude("xaby", rules) == 1.0
    assert judges.check_include_exclude("xay", rules) == 0.0
    assert judges.check_include_exclude("abz", rules) == 0.0
    assert judges.check_include_exclude(None, rules) == 0.0


def test_compare_text_file(tmp_path):
    expected = write(tmp_path / "e.txt", "Hello  world\n")
    assert judges.compare_text_file(write(tmp_path / "a.txt", "Hello  world\n"), expected) == 1.0
    assert judges.compare_text_file(write(tmp_path / "b.txt", "hello world"), expected) == 0.0
    assert judges.compare_text_file(str(tmp_path / "b.txt"), expected, ignore_blanks=True, ignore_case=True) == 1.0
    assert judges.compare_text_file(None, expected) == 0.0
    with pytest.raises(judges.JudgeError, match="expected file"):
        judges.compare_text_file(expected, str(tmp_path / "missing.txt"))


def test_check_json(tmp_path):
    path = write(tmp_path / "s.json", json.dumps({"a": {"b": [1, 2]}, "c": "x"}))
    rules = {"expect": [{"key": ["a", "b", 1], "method": "eq", "ref": 2},
                        {"key": ["a", "b"], "method": "has", "ref": 1},
                        {"key": ["c"], "method": "exists"}],
             "unexpect": [{"key": ["d"], "method": "exists"}]}
    assert judges.check_json(path, rules) == 1.0
    assert judges.check_json(path, {"expect": [{"key": ["c"], "method": "eq", "ref": "y"}]}) == 0.0
    assert judges.check_json(path, {"unexpect": [{"key": ["c"], "method": "ne", "ref": "y"}]}) == 0.0
    assert judges.check_json(write(tmp_path / "bad.json", "{"), rules) == 0.0
    assert judges.check_json(None, rules) == 0.0
    with pytest.raises(judges.JudgeError, match="bad check_json rule"):
        judges.check_json(path, {"expect": [{"key": ["c"], "method": "approximately"}]})


def test_compare_table_csv(tmp_path):
    expected = write(tmp_path / "e.csv", "item,qty\npear,5\n")
    assert judges.compare_table(write(tmp_path / "a.csv", "item,qty\npear,5.0,\n\n"), expected) == 1.0
    assert judges.compare_table(write(tmp_path / "b.csv", "item,qty\npear,6\n"), expected) == 0.0
    assert judges.compare_table(str(tmp_path / "none.csv"), expected) == 0.0
    assert judges.compare_table(write(tmp_path / "c.xlsx", "not a zip"), expected) == 0.0
    with pytest.raises(judges.JudgeError, match="reads .csv and .xlsx"):
        judges.compare_table(write(tmp_path / "d.ods", "x"), write(tmp_path / "e.ods", "x"))


def test_infeasible_looks_at_the_last_action():
    assert judges.infeasible(last_action=A.Fail()) == 1.0
    assert judges.infeasible(last_action=A.Done()) == 0.0
    assert judges.infeasible(last_action=A.InvalidAction("x")) == 0.0


@pytest.fixture(scope="module")
def loopback_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    (root / "expected.txt").write_text("served text\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_fetch_local_file_and_loopback_urls_only(tmp_path, loopback_server):
    write(tmp_path / "local.txt", "local")
    assert judges.fetch("local.txt", str(tmp_path)) == b"local"
    assert judges.fetch(f"file://{tmp_path}/local.txt", "/") == b"local"
    assert judges.fetch(f"{loopback_server}/expected.txt", "/") == b"served text\n"
    with pytest.raises(PermissionError, match="only loopback"):
        judges.fetch("http://example.com/x", "/")
    with pytest.raises(ValueError, match="unsupported URL scheme"):
        judges.fetch("ftp://127.0.0.1/x", "/")


def test_host_getters(tmp_path, loopback_server):
    write(tmp_path / "expected.txt", "e")
    task = parse_task({"id": "g", "instruction": "x", "evaluator": {"func": "infeasible"}}, tmp_path)
    getters = judges.Getters(None, task, tmp_path / "cache")
    assert getters.rule({"expected": 1}) == {"expected": 1}
    assert getters.local_file("expected.txt") == str(tmp_path / "expected.txt")
    with pytest.raises(judges.JudgeError, match="does not exist"):
        getters.local_file("nope.txt")
    cached = getters.cloud_file(f"{loopback_server}/expected.txt")
    assert open(cached).read() == "served text\n"
    assert getters.cloud_file(f"{loopback_server}/expected.txt") == cached  # fetched once
    with pytest.raises(judges.JudgeError, match="cannot fetch"):
        getters.cloud_file(f"{loopback_server}/absent.txt")


def test_setup_errors_name_the_step(tmp_path):
    steps = (Step("sleep", {"seconds": 0}), Step("download", {"files": [{"url": "missing.bin", "path": "/x"}]}))
    with pytest.raises(judges.SetupError, match=r"step 1 \(download\) failed: no such file"):
        judges.run_steps(steps, None, str(tmp_path))


def verdict(tmp_path, evaluator, last_action=A.Done()):
    task = parse_task({"id": "v", "instruction": "x", "evaluator": evaluator}, tmp_path)
    return judges.evaluate(task, None, tmp_path / "cache", last_action=last_action)


def test_conjunctions_combine_like_osworld(tmp_path):
    write(tmp_path / "a.txt", "a")
    write(tmp_path / "b.txt", "b")
    same = {"func": "compare_text_file", "result": {"type": "local_file", "path": "a.txt"},
            "expected": {"type": "local_file", "path": "a.txt"}}
    differ = {**same, "expected": {"type": "local_file", "path": "b.txt"}}

    def combined(conj, *checks):
        return {"conj": conj, **{key: [c[key] for c in checks] for key in ("func", "result", "expected")}}

    assert verdict(tmp_path, combined("and", same, same)) == 1.0
    assert verdict(tmp_path, combined("and", same, differ)) == 0.0
    assert verdict(tmp_path, combined("or", differ, same)) == 1.0
    assert verdict(tmp_path, combined("or", differ, differ)) == 0.0
    assert verdict(tmp_path, same, last_action=A.Fail()) == 0.0  # declared a feasible task infeasible
    assert verdict(tmp_path, {"func": "infeasible"}, last_action=A.Fail()) == 1.0
