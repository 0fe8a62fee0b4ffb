"""The in-container runner of the code environment (standard library only).

PID 1 of a code container runs `runner.py init`: it reaps orphans and ignores signals, so
that `kill -9` of everything else (a reset) leaves the container alive. Every other call is
`runner.py <request>` through `docker exec`, with the request as base64 of a JSON object and
the answer as one JSON line on stdout:

    {"op": "reset", "package": P, "hunks": [...]}      kill every other process, empty /work
                                                        and /tmp, copy /opt/repos/P to the work
                                                        tree, apply the hunks (the task's bug)
    {"op": "bash", "command": C, "timeout": T, "limit": N}
                                                        run C with bash in the work tree, in a
                                                        session of its own, killed with it at
                                                        T seconds; the first and last N/2
                                                        bytes of each stream come back
    {"op": "edit", "command": "view"|"create"|"str_replace"|"insert", "path": ..., ...}
    {"op": "judge", "package": P, "hunks": [...], "sources": [...], "test_files": [...], "timeout": T}
                                                        the verdict's test run (below); per-test
                                                        outcomes, and the agent's changes that
                                                        were not judged

The host runs the runner as `python3 -I` (isolated): the agent's tree is on the image's
PYTHONPATH and HOME is /work, so a plain `python3` would import the agent's sitecustomize.py,
usercustomize.py or .pth files into the runner itself.

The judge scores only the fix. It kills every process but PID 1 and itself, empties /tmp,
copies the clean repository /opt/repos/P to a fresh folder there, applies the task's bug
(`hunks`) and carries over from the work tree only the package's source files (`sources`): their
bytes, or their deletion; a source that is a symlink, a folder or any other non-regular file
fails the episode. Every other difference of the work tree from the clean tree with the bug
(files added, changed or deleted, tests edited; __pycache__ apart) is left behind and listed in
the answer (`changes_outside_sources`, the first 50, and their count), beside how many of the
sources the agent changed (`changed_sources_count`, 0: no patch). A failure to carry the sources
over (the patch does not apply) answers with `"stage": "carry"`. pytest runs on that copy
through judge_pytest.py with `python3 -I -B`, a fixed environment (PATH, LANG, an empty HOME,
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, no PYTEST_ADDOPTS), `-p no:cacheprovider` and the rootdir
fixed to the copy, so configuration files and conftest.py are the clean repository's own. The
outcomes come from the judge plugin through a pipe whose write end only pytest holds (no report
file anyone could plant or rewrite); per test the worst outcome reported wins (error, failed,
skipped, passed), so a line forged after a failure cannot undo it. Every process is killed again
once pytest exits. The judge fails the episode when the tests run past the timeout, when pytest
ends without finishing its session, when the channel carries lines the plugin did not write,
and when the plugin finds that the code under test replaced pytest internals that decide
outcomes (judge_pytest.py's WATCHED, and the hook implementations of the plugin manager).

What stays open: the code under test runs inside pytest's own process, so it can alter that
process in memory in ways the identity check does not see, e.g. patch the judge plugin's own
state found through the garbage collector, write forged lines and a forged end of session to the
report pipe and exit at once, patch something outside WATCHED (the test module's globals, the
builtins the tests call), or return objects whose __eq__ always holds. One Python process cannot
protect a part of itself from other code it runs; closing this needs the code under test in a
process of its own whose results the tests check from outside it, which the repositories' own
test suites (assertions in the same process as the code) do not allow.

`{"op": "judge", ..., "isolated": false}` runs the former judge, pytest in the work tree itself
with a JUnit report (judge_in_work_tree); only experiments/benchmarks/code_env.py sends it, as
the baseline of the judge's cost.

Every answer carries `limits`: the cgroup's OOM-kill count, how often the pids limit refused
a fork, and the work tree's free bytes, from which the host tells resource faults apart.
"""

from __future__ import annotations

import base64
import collections
import filecmp
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

WORK = "/work"
REPO = "/work/repo"
REPOS = "/opt/repos"
JUNIT = "/tmp/.cua-judge.xml"
MAX_VIEW_LINES = 400


# ---- PID 1 ------------------------------------------------------------------------------
def init() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)
        except InterruptedError:
            pass


# ---- resource limits seen from inside ------------------------------------------------------
def _read_counter(paths: list[str], key: str) -> int:
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except OSError:
            continue
    return 0


def limits() -> dict:
    try:
        stat = os.statvfs(WORK)
        free = stat.f_bavail * stat.f_frsize
    except OSError:
        free = -1
    return {
        # cgroup v1 and v2 layouts
        "oom_kills": _read_counter(["/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"],
                                   "oom_kill"),
        "pids_max_hits": _read_counter(["/sys/fs/cgroup/pids/pids.events", "/sys/fs/cgroup/pids.events"], "max"),
        "work_free_bytes": free,
    }


# ---- reset ----------------------------------------------------------------------------------
def _kill_others() -> int:
    me = os.getpid()
    killed = 0
    for _ in range(50):  # a fork bomb refills the table: sweep until nothing is left
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not others:
            return killed
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    raise RuntimeError("processes keep appearing after 50 sweeps of kill -9")


def _empty(folder: str) -> None:
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def apply_hunks(root: str, hunks: list[dict]) -> None:
    """Replace `old` lines by `new` lines at `start` (1-based) in each hunk's file."""
    for hunk in hunks:
        path = os.path.join(root, hunk["path"])
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        start = hunk["start"] - 1
        if lines[start:start + len(hunk["old"])] != hunk["old"]:
            raise ValueError(f"{hunk['path']}:{hunk['start']}: the hunk does not match the file")
        lines[start:start + len(hunk["old"])] = hunk["new"]
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))


def reset(request: dict) -> dict:
    killed = _kill_others()
    _empty(WORK)
    _empty("/tmp")
    source = os.path.join(REPOS, request["package"])
    if not os.path.isdir(source):
        return {"ok": False, "error": f"no repository {request['package']!r} in this image: {sorted(os.listdir(REPOS))}"}
    shutil.copytree(source, REPO, symlinks=True)
    apply_hunks(REPO, request.get("hunks", []))
    return {"ok": True, "killed": killed}


# ---- bash -----------------------------------------------------------------------------------
class _Capture:
    """The first and last `half` bytes of a stream, and its total length."""

    def __init__(self, stream, half: int):
        self.stream, self.half = stream, half
        self.head = bytearray()
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_len = 0
        self.total = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
            if not chunk:
                return
            self.total += len(chunk)
            room = self.half - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self.tail.append(chunk)
                self.tail_len += len(chunk)
                while self.tail and self.tail_len - len(self.tail[0]) >= self.half:
                    self.tail_len -= len(self.tail.popleft())

    def result(self) -> dict:
        tail = b"".join(self.tail)[-self.half:] if self.half else b""
        return {"head": base64.b64encode(bytes(self.head)).decode(), "tail": base64.b64encode(tail).decode(),
                "total": self.total}


def bash(request: dict) -> dict:
    timeout, half = float(request["timeout"]), max(0, int(request["limit"]) // 2)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(["bash", "-c", request["command"]], cwd=REPO if os.path.isdir(REPO) else WORK,
                                stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as error:  # no process could start: the pids limit, or no memory
        return {"ok": False, "error": f"cannot start the command: {error}"}
    out, err = _Capture(proc.stdout, half), _Capture(proc.stderr, half)
    timed_out = False
    forks_refused = limits()["pids_max_hits"]
    deadline, delay = started + timeout, 0.005
    while proc.poll() is None:
        if time.monotonic() > deadline:
            timed_out = True
            break
        # A refused fork is already a fault: stop the command rather than let bash retry.
        if limits()["pids_max_hits"] > forks_refused:
            break
        time.sleep(delay)
        delay = min(0.05, delay * 2)
    # The command's session ends with it: background jobs it left behind are killed too.
    for _ in range(20):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.01)
    code = proc.wait()
    out.thread.join(2.0)
    err.thread.join(2.0)
    return {"ok": True, "exit_code": code, "timed_out": timed_out, "seconds": time.monotonic() - started,
            "stdout": out.result(), "stderr": err.result()}


# ---- the file editor --------------------------------------------------------------------
class EditError(Exception):
    pass


def _inside(path: str, must_exist: bool) -> str:
    if not isinstance(path, str) or not path:
        raise EditError("a path is required")
    full = os.path.realpath(os.path.join(REPO, path))  # relative paths are the repository's
    if full != REPO and not full.startswith(REPO + os.sep):
        raise EditError(f"refused: {path} is outside the repository {REPO}; edits stay inside it")
    if must_exist and not os.path.exists(full):
        raise EditError(f"{path} does not exist")
    return full


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{first + i:6d}\t{line}" for i, line in enumerate(lines))


def _read_text(full: str, path: str) -> str:
    if os.path.isdir(full):
        raise EditError(f"{path} is a directory")
    with open(full, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise EditError(f"{path} is not UTF-8 text ({len(data)} bytes)") from None


def _write_text(full: str, text: str) -> None:
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)


def _snippet(text: str, line: int, context: int = 4) -> str:
    lines = text.split("\n")
    first = max(1, line - context)
    return _numbered(lines[first - 1:line + context], first)


def edit(request: dict) -> dict:
    command, path = request.get("command"), request.get("path")
    try:
        if command == "view":
            full = _inside(path, must_exist=True)
            if os.path.isdir(full):
                entries = []
                for dirpath, dirnames, filenames in os.walk(full):
                    depth = os.path.relpath(dirpath, full).count(os.sep) + (dirpath != full)
                    dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
                    if depth >= 2:
                        dirnames[:] = []
                    for name in sorted(dirnames) + sorted(filenames):
                        entries.append(os.path.relpath(os.path.join(dirpath, name), REPO))
                return {"ok": True, "output": "\n".join(entries[:1000])}
            lines = _read_text(full, path).split("\n")
            first, last = request.get("view_range") or (1, len(lines))
            if last == -1:
                last = len(lines)
            if not 1 <= first <= max(1, len(lines)) or last < first:
                raise EditError(f"view_range {[first, last]} is outside the file's {len(lines)} lines")
            last = min(last, len(lines), first + MAX_VIEW_LINES - 1)
            note = "" if last == len(lines) else f"\n[... lines {last + 1}-{len(lines)} not shown; use view_range ...]"
            return {"ok": True, "output": _numbered(lines[first - 1:last], first) + note}
        if command == "create":
            full = _inside(path, must_exist=False)
            if os.path.isdir(full):
                raise EditError(f"{path} is a directory")
            _write_text(full, request["file_text"])
            return {"ok": True, "output": f"created {path}"}
        if command == "str_replace":
            full = _inside(path, must_exist=True)
            text = _read_text(full, path)
            old, new = request["old_str"], request.get("new_str", "")
            count = text.count(old)
            if count != 1:
                raise EditError(f"old_str occurs {count} times in {path}; it must occur exactly once"
                                + ("" if count == 0 else " (add surrounding lines to make it unique)"))
            at = text.index(old)
            text = text[:at] + new + text[at + len(old):]
            _write_text(full, text)
            line = text[:at].count("\n") + 1
            return {"ok": True, "output": f"edited {path}:\n" + _snippet(text, line)}
        if command == "insert":
            full = _inside(path, must_exist=True)
            text = _read_text(full, path)
            lines = text.split("\n")
            at = request["insert_line"]
            if not 0 <= at <= len(lines):
                raise EditError(f"insert_line {at} is outside [0, {len(lines)}]")
            lines[at:at] = request["new_str"].split("\n")
            text = "\n".join(lines)
            _write_text(full, text)
            return {"ok": True, "output": f"inserted into {path}:\n" + _snippet(text, at + 1)}
        raise EditError(f"unknown editor command {command!r}")
    except EditError as error:
        return {"ok": False, "error": str(error)}
    except OSError as error:
        return {"ok": False, "error": f"{path}: {error.strerror or error}"}


# ---- the judge ----------------------------------------------------------------------------
JUDGE_PYTEST = "/opt/cua/judge_pytest.py"
JUDGE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
OUTCOME_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}  # the worst outcome of a test wins
MAX_LISTED_CHANGES = 50
MAX_SOURCE_BYTES = 1 << 20
MAX_REPORT_LINE = 1 << 16
MAX_REPORTED_TESTS = 100_000


class JudgeRefusal(Exception):
    """The agent's tree cannot be judged (a source that is no regular file): the episode fails."""


def _entries(root: str) -> dict[str, os.stat_result]:
    """Every path under `root` (relative, '/'-separated) with its lstat; __pycache__ and .pyc
    left out (bytecode is no change)."""
    found: dict[str, os.stat_result] = {}
    folders = [(root, "")]  # a stack, not recursion: the agent decides how deep the tree is
    while folders:
        folder, prefix = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name == "__pycache__" or entry.name.endswith(".pyc"):
                continue
            rel = prefix + entry.name
            found[rel] = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(found[rel].st_mode):
                folders.append((entry.path, rel + "/"))
    return found


def _same(rel: str, a: os.stat_result, b: os.stat_result, root_a: str, root_b: str) -> bool:
    if stat.S_IFMT(a.st_mode) != stat.S_IFMT(b.st_mode):
        return False
    if stat.S_ISDIR(a.st_mode):
        return True
    if stat.S_ISLNK(a.st_mode):
        return os.readlink(os.path.join(root_a, rel)) == os.readlink(os.path.join(root_b, rel))
    if stat.S_ISREG(a.st_mode):
        return a.st_size == b.st_size and filecmp.cmp(os.path.join(root_a, rel), os.path.join(root_b, rel),
                                                      shallow=False)
    return False


def changed_paths(tree: str, reference: str) -> list[str]:
    """The paths where `tree` differs from `reference`, sorted: files added, removed or changed
    (content, or kind: file, folder, symlink); a folder that only one side has is named by its
    contents, or by itself (with a trailing '/') when empty."""
    ours, theirs = _entries(tree), _entries(reference)
    parents = {rel.rpartition("/")[0] for rel in list(ours) + list(theirs)}
    changed = []
    for rel in sorted(ours.keys() | theirs.keys()):
        a, b = ours.get(rel), theirs.get(rel)
        if a is not None and b is not None:
            if not _same(rel, a, b, tree, reference):
                changed.append(rel)
            continue
        one = a or b
        if stat.S_ISDIR(one.st_mode):
            if rel not in parents:
                changed.append(rel + "/")
        else:
            changed.append(rel)
    return changed


def _carry_source(rel: str, tree: str, judged: str) -> None:
    """Put the agent's version of the source file `rel` into the judged copy: its bytes, or its
    deletion when the agent deleted it (or a folder above it)."""
    if rel.startswith("/") or ".." in rel.split("/"):
        raise JudgeRefusal(f"{rel!r} is no path inside the repository")
    path, parts = tree, rel.split("/")
    for depth, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            if os.path.lexists(os.path.join(judged, rel)):
                os.unlink(os.path.join(judged, rel))
            return
        where = "/".join(parts[:depth + 1])
        if stat.S_ISLNK(info.st_mode):
            raise JudgeRefusal(f"the source file {rel} cannot be judged: {where} is a symlink (to "
                               f"{os.readlink(path)}); a source must be a regular file in the repository")
        if depth < len(parts) - 1 and not stat.S_ISDIR(info.st_mode):
            raise JudgeRefusal(f"the source file {rel} cannot be judged: {where} is not a folder")
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "no regular file"
        raise JudgeRefusal(f"the source file {rel} cannot be judged: it is {kind}")
    if info.st_size > MAX_SOURCE_BYTES:
        raise JudgeRefusal(f"the source file {rel} cannot be judged: {info.st_size} bytes, at most {MAX_SOURCE_BYTES}")
    target = os.path.join(judged, rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(path, target)


class _ReportReader:
    """The judge plugin's report lines (judge_pytest.py), read from a pipe until every writer
    has exited: per test its worst outcome, so that a later line cannot undo a failure."""

    def __init__(self, fd: int):
        self.outcomes: dict[str, str] = {}
        self.messages: dict[str, str] = {}
        self.finished = 0
        self.altered: list[str] = []
        self.unreadable = 0
        self.thread = threading.Thread(target=self._run, args=(fd,), daemon=True)
        self.thread.start()

    def _run(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            while line := pipe.readline(MAX_REPORT_LINE):
                try:
                    self._take(json.loads(line))
                except (ValueError, KeyError, TypeError, AttributeError):
                    self.unreadable += 1

    def _take(self, record: dict) -> None:
        if record.get("finished") is True:
            self.finished += 1
            self.altered += [str(name) for name in record["altered"]]
            return
        test, outcome, message = record["test"], record["outcome"], str(record.get("message", ""))
        if not isinstance(test, str) or outcome not in OUTCOME_RANK:
            raise ValueError(record)
        if test not in self.outcomes and len(self.outcomes) >= MAX_REPORTED_TESTS:
            raise ValueError("too many tests")
        if test not in self.outcomes or OUTCOME_RANK[outcome] > OUTCOME_RANK[self.outcomes[test]]:
            self.outcomes[test] = outcome
            if message:
                self.messages[test] = message[:500]


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def judge(request: dict) -> dict:
    """The verdict's test run on a pristine copy: the clean repository with the task's bug and
    the agent's versions of the package's source files, nothing else of the agent's tree."""
    if request.get("isolated", True) is False:
        return judge_in_work_tree(request)
    if "hunks" not in request or "sources" not in request:
        return {"ok": False, "error": "a judge request names the task's bug ('hunks') and the package's "
                                      "source files ('sources')"}
    clean = os.path.join(REPOS, request["package"])
    if not os.path.isdir(clean):
        return {"ok": False, "error": f"no repository {request['package']!r} in this image"}
    _kill_others()  # nothing the agent started may watch or touch the judged copy
    _empty("/tmp")
    judged = tempfile.mkdtemp(prefix="cua-judge-", dir="/tmp")
    home = tempfile.mkdtemp(prefix="cua-judge-home-", dir="/tmp")
    try:
        return _judge_copy(request, clean, judged, home)
    finally:
        _remove(judged)
        _remove(home)


def _judge_copy(request: dict, clean: str, judged: str, home: str) -> dict:
    shutil.copytree(clean, judged, symlinks=True, dirs_exist_ok=True)
    apply_hunks(judged, request["hunks"])
    sources = set(request["sources"])
    if os.path.islink(REPO) or (os.path.lexists(REPO) and not os.path.isdir(REPO)):
        return {"ok": False, "stage": "carry", "error": f"the work tree {REPO} is no folder",
                "changes_outside_sources": [], "changes_outside_sources_count": 0, "changed_sources_count": 0}
    paths = changed_paths(REPO, judged)
    changed = [rel for rel in paths if rel not in sources]
    listing = {"changes_outside_sources": changed[:MAX_LISTED_CHANGES], "changes_outside_sources_count": len(changed),
               "changed_sources_count": len(paths) - len(changed)}
    try:
        for rel in sorted(sources):
            _carry_source(rel, REPO, judged)
    except JudgeRefusal as refusal:
        return {"ok": False, "stage": "carry", "error": str(refusal), **listing}
    except OSError as error:
        return {"ok": False, "stage": "carry", "error": f"cannot copy the sources for the judge: {error}", **listing}

    read_end, write_end = os.pipe()
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", JUDGE_PYTEST, str(write_end), judged, "-q", "-p", "no:cacheprovider",
             f"--rootdir={judged}", *request["test_files"]],
            cwd=judged, env={**JUDGE_ENV, "HOME": home}, pass_fds=(write_end,), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        os.close(write_end)  # pytest (and whatever it forks) holds the only write end
    reports = _ReportReader(read_end)
    output = _Capture(proc.stdout, 1000)
    try:
        proc.wait(timeout=float(request["timeout"]))
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    code = proc.wait()
    seconds = time.monotonic() - started
    _kill_others()  # whatever the tests started, in their session or not; the report pipe closes
    reports.thread.join(5.0)
    output.thread.join(2.0)
    tail = b"".join(output.tail)[-1500:].decode(errors="replace") or bytes(output.head).decode(errors="replace")
    if seconds > float(request["timeout"]):
        return {"ok": False, "error": f"the tests ran past {request['timeout']}s", **listing}
    if reports.thread.is_alive():
        return {"ok": False, "error": "the judge's report channel stayed open after pytest ended", **listing}
    if reports.unreadable:
        return {"ok": False, "error": "the judge's report channel carried lines the judge did not write "
                                      f"({reports.unreadable})", **listing}
    if not reports.finished:
        return {"ok": False, "error": f"pytest ended without finishing its session (exit {code}): {tail}", **listing}
    if reports.altered:
        return {"ok": False, "error": "the tests' harness was altered by the code under test: "
                                      + ", ".join(sorted(set(reports.altered))), **listing}
    return {"ok": True, "outcomes": reports.outcomes, "messages": reports.messages, "exit_code": code,
            "seconds": seconds, "output_tail": tail, **listing}


def _junit_key(classname: str, name: str) -> str:
    return f"{classname}::{name}" if classname else name


def judge_in_work_tree(request: dict) -> dict:
    """The former judge, a baseline for experiments/benchmarks/code_env.py only: pytest in the
    agent's own tree (test files restored) with a JUnit report, which the agent's conftest.py,
    configuration files, sitecustomize.py and leftover processes all reach."""
    source = os.path.join(REPOS, request["package"])
    for rel in request["test_files"]:  # the tests the verdict rests on are the clean ones
        clean, target = os.path.join(source, rel), os.path.join(REPO, rel)
        if os.path.isdir(clean):
            if os.path.lexists(target):
                shutil.rmtree(target) if os.path.isdir(target) and not os.path.islink(target) else os.unlink(target)
            shutil.copytree(clean, target, symlinks=True)
        else:
            if os.path.lexists(target) and os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(clean, target)
    if os.path.exists(JUNIT):
        os.unlink(JUNIT)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
         f"--junitxml={JUNIT}", *request["test_files"]],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    output = _Capture(proc.stdout, 1000)
    try:
        proc.wait(timeout=float(request["timeout"]))
    except subprocess.TimeoutExpired:
        pass
    try:  # the tests' session ends with them, whatever they started
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    code = proc.wait()
    output.thread.join(2.0)
    seconds = time.monotonic() - started
    tail = b"".join(output.tail)[-1500:].decode(errors="replace") or bytes(output.head).decode(errors="replace")
    if seconds > float(request["timeout"]):
        return {"ok": False, "error": f"the tests ran past {request['timeout']}s"}
    if not os.path.exists(JUNIT):
        return {"ok": False, "error": f"pytest wrote no report (exit {code}): {tail}"}
    outcomes, messages = {}, {}
    for case in ET.parse(JUNIT).getroot().iter("testcase"):
        key = _junit_key(case.get("classname", ""), case.get("name", ""))
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = ("failed" if child.tag == "failure" else "error"), child.get("message", "")
                break
            if child.tag == "skipped":
                outcome = "skipped"
        outcomes[key] = outcome
        if message:
            messages[key] = message[:500]
    return {"ok": True, "outcomes": outcomes, "messages": messages, "exit_code": code, "seconds": seconds,
            "output_tail": tail}


OPS = {"reset": reset, "bash": bash, "edit": edit, "judge": judge}


def main(argv: list[str]) -> None:
    if argv[:1] == ["init"]:
        init()
        return
    request = json.loads(base64.b64decode(argv[0]))
    answer = OPS[request["op"]](request)
    answer["limits"] = limits()
    sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
