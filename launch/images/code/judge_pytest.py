"""The code judge's pytest, started by runner.py's judge (never by the agent's tree):

    python3 -I -B /opt/cua/judge_pytest.py REPORT_FD REPO [pytest arguments]

`-I` (isolated mode): no PYTHON* variables, no user site, not the script's folder on sys.path,
so nothing outside the image runs before pytest does. REPO (the judge's pristine copy of the
repository) and REPO/src, where it exists, go on sys.path as `python -m pytest` run in REPO with
PYTHONPATH=REPO/src (the agent's shell) would put them.

The judge plugin, registered here (nothing in the repository can name or unname it), writes to
the file descriptor REPORT_FD (a pipe the runner reads) one JSON line per test report that
matters and per collection report that did not pass:

    {"test": "<classname>::<name>", "outcome": "passed"|"failed"|"error"|"skipped", "message": "..."}

the test's name and outcome as pytest's own JUnit XML report (xunit1) gives them, and at the end
of the session one line

    {"finished": true, "exitstatus": N, "altered": [...]}

where `altered` names the pytest internals that decide outcomes and that are no longer what they
were before any module of the repository was imported (runner.py's docstring says what this
check cannot see).
"""

import inspect
import json
import os
import sys

import _pytest
import _pytest.main
import _pytest.python
import _pytest.python_api
import _pytest.reports
import _pytest.runner
import _pytest.skipping
import _pytest.unittest
import json.encoder
import pluggy
import pluggy._callers
import pluggy._hooks
import pluggy._manager
import pytest
from _pytest.junitxml import bin_xml_escape, mangle_test_address

# What decides a test's outcome and carries it to the report channel: module functions, methods
# and class attributes, looked up as their owner sees them.
WATCHED = (
    (_pytest.main, "pytest_runtestloop"),
    (_pytest.runner, "pytest_runtest_protocol"), (_pytest.runner, "runtestprotocol"),
    (_pytest.runner, "call_and_report"), (_pytest.runner, "check_interactive_exception"),
    (_pytest.runner, "pytest_runtest_makereport"), (_pytest.runner.CallInfo, "from_call"),
    (_pytest.reports.TestReport, "from_item_and_call"), (_pytest.reports.TestReport, "__init__"),
    (_pytest.reports.CollectReport, "__init__"), (_pytest.reports.BaseReport, "passed"),
    (_pytest.reports.BaseReport, "failed"), (_pytest.reports.BaseReport, "skipped"),
    (_pytest.skipping, "pytest_runtest_makereport"),
    (_pytest.python, "pytest_pyfunc_call"), (_pytest.python.Function, "runtest"),
    (_pytest.unittest.TestCaseFunction, "runtest"),
    (_pytest.python_api, "raises"), (_pytest.python_api, "approx"), (_pytest.python_api.RaisesContext, "__exit__"),
    (pytest, "raises"), (pytest, "approx"), (pytest, "fail"), (pytest, "skip"),
    (pluggy._callers, "_multicall"), (pluggy._hooks.HookCaller, "__call__"),
    (pluggy._manager.PluginManager, "_hookexec"),
    (json.encoder, "c_make_encoder"), (json.encoder, "encode_basestring_ascii"),
    (json.encoder.JSONEncoder, "encode"), (json.encoder.JSONEncoder, "iterencode"),
)
# Hook implementations added during the session are pytest's own or the repository's conftest.py.
PYTEST_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (_pytest, pluggy))


def _code(value):
    """The code objects behind a function, method, classmethod, staticmethod or property."""
    for part in (getattr(value, "__func__", None), getattr(value, "fget", None), value):
        code = getattr(part, "__code__", None)
        if code is not None:
            return code
    return None


def _name(owner, attribute: str) -> str:
    if inspect.isclass(owner):
        return f"{owner.__module__}.{owner.__qualname__}.{attribute}"
    return f"{owner.__name__}.{attribute}"


class JudgePlugin:
    """Writes the report lines (module docstring) and checks, at the end of the session, what
    the code under test may have replaced since the plugin was made (before any test module)."""

    def __init__(self, report_fd: int, repo: str):
        self.report_fd, self.repo = report_fd, os.path.realpath(repo) + os.sep
        self.write, self.encode = os.write, json.JSONEncoder(ensure_ascii=True).encode  # bound before the tests run
        self.watched = []
        for owner, attribute in WATCHED:
            value = inspect.getattr_static(owner, attribute)
            self.watched.append((owner, attribute, value, _code(value)))
        self.pluginmanager = self.inner_hookexec = self.hooks = None

    def _emit(self, record: dict) -> None:
        self.write(self.report_fd, (self.encode(record) + "\n").encode())

    def _hooks(self) -> dict:
        """Per hook: its caller, the caller's executor and its implementations (with their functions)."""
        return {name: (caller, caller._hookexec, [(impl, impl.function, _code(impl.function))
                                                  for impl in caller.get_hookimpls()])
                for name, caller in vars(self.pluginmanager.hook).items() if isinstance(caller, pluggy.HookCaller)}

    def _allowed(self, function) -> bool:
        code = _code(function)
        filename = os.path.realpath(code.co_filename) if code is not None else ""
        return filename.startswith(PYTEST_DIRS) or (filename.startswith(self.repo)
                                                    and os.path.basename(filename) == "conftest.py")

    def altered(self) -> list[str]:
        found = [_name(owner, attribute) for owner, attribute, value, code in self.watched
                 if inspect.getattr_static(owner, attribute, None) is not value
                 or _code(inspect.getattr_static(owner, attribute, None)) is not code]
        if self.hooks is None:
            return found
        if self.pluginmanager._inner_hookexec is not self.inner_hookexec:
            found.append("pluggy.PluginManager._inner_hookexec")
        now = self._hooks()
        for name, (caller, hookexec, impls) in now.items():
            if name not in self.hooks:  # a hook a conftest.py declared
                continue
            caller_before, hookexec_before, impls_before = self.hooks[name]
            if caller is not caller_before or hookexec is not hookexec_before:
                found.append(f"the {name} hook's caller")
            before = {impl: (function, code) for impl, function, code in impls_before}
            for impl, function, code in impls:
                if impl in before:
                    if before[impl][0] is not function or before[impl][1] is not code:
                        found.append(f"the {name} implementation of {impl.plugin_name}")
                elif not self._allowed(function):
                    found.append(f"a {name} implementation added by {impl.plugin_name}")
            kept = {impl for impl, _, _ in impls}
            found += [f"the {name} implementation of {impl.plugin_name} (removed)" for impl, _, _ in impls_before
                      if impl not in kept]
        found += [f"the {name} hook (removed)" for name in self.hooks if name not in now]
        return found

    # ---- hooks ----
    @pytest.hookimpl(tryfirst=True)
    def pytest_load_initial_conftests(self, early_config):
        # Before any conftest.py or test module is imported.
        self.pluginmanager = early_config.pluginmanager
        self.inner_hookexec = self.pluginmanager._inner_hookexec
        self.hooks = self._hooks()

    def pytest_runtest_logreport(self, report):
        # The outcomes pytest's junitxml records: a passing test by its call, a failing setup
        # or teardown as an error, an xfail as skipped.
        if report.passed:
            if report.when == "call":
                self._record(report.nodeid, "passed", "")
        elif report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            reason = crash.message if crash is not None else str(report.longrepr)
            if report.when != "call":
                self._record(report.nodeid, "error", f'failed on {report.when} with "{reason}"')
            elif hasattr(report, "wasxfail"):
                self._record(report.nodeid, "skipped", "")
            else:
                self._record(report.nodeid, "failed", reason)
        else:
            self._record(report.nodeid, "skipped", "")

    def pytest_collectreport(self, report):
        if report.failed:
            self._record(report.nodeid, "error", "collection failure")
        elif report.skipped:
            self._record(report.nodeid, "skipped", "")

    def pytest_internalerror(self, excrepr):
        self._emit({"test": "pytest::internal", "outcome": "error", "message": "internal error"})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self._emit({"finished": True, "exitstatus": int(exitstatus), "altered": self.altered()})

    def _record(self, nodeid: str, outcome: str, message: str) -> None:
        names = mangle_test_address(nodeid)
        classname, name = ".".join(names[:-1]), bin_xml_escape(names[-1])
        self._emit({"test": f"{classname}::{name}" if classname else name, "outcome": outcome,
                    "message": bin_xml_escape(message)[:500]})


def main(argv: list[str]) -> int:
    report_fd, repo, args = int(argv[0]), argv[1], argv[2:]
    os.set_inheritable(report_fd, False)  # the tests' own subprocesses do not get the channel
    src = os.path.join(repo, "src")
    sys.path[:0] = [repo] + ([src] if os.path.isdir(src) else [])
    plugin = JudgePlugin(report_fd, repo)
    return pytest.main(args, plugins=[plugin])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
