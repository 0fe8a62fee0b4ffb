"""The step runner of launch/setup.sh (launch/setup_steps.sh), driven by bash as setup.sh drives
it: a sourced script under `set -euo pipefail` whose steps print one line each, with the output
of their commands in the log, and whose failing step prints the log's tail and path and exits."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = os.path.join(REPO, "launch", "setup_steps.sh")


def _source(tmp_path, body: str) -> subprocess.CompletedProcess:
    """Runs `body` in a script that is sourced, as launch/test.sh sources setup.sh."""
    script = tmp_path / "script.sh"
    script.write_text(f'source "{STEPS}"\nsetup_log_start "{tmp_path}/logs"\n{body}\n')
    return subprocess.run(
        ["bash", "-c", f'set -euo pipefail; source "{script}"; echo after-source >&2'],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _step_lines(stderr: str) -> list[str]:
    """stderr's lines without the elapsed time a step prints once it has taken a second or more:
    on a loaded machine any step may cross a second boundary."""
    return [re.sub(r" \(\d+ s\)$", "", line) for line in stderr.splitlines()]


def _log_path(stderr: str) -> str:
    first = stderr.splitlines()[0]
    assert first.startswith("[setup] log: "), stderr
    return first.removeprefix("[setup] log: ")


def test_steps_print_one_line_each_and_log_their_commands(tmp_path):
    result = _source(
        tmp_path,
        """
setup_step first
setup_run bash -c 'echo to-stdout; echo to-stderr >&2'
setup_done done
setup_step second
setup_run true
setup_done "all present"
""",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    log = _log_path(result.stderr)
    assert _step_lines(result.stderr) == [
        f"[setup] log: {log}",
        "[setup] first ... done",
        "[setup] second ... all present",
        "after-source",
    ]
    text = pathlib.Path(log).read_text()
    assert "to-stdout\nto-stderr\n" in text and "$ true" in text


def test_a_step_of_a_second_or_more_prints_its_elapsed_time(tmp_path):
    result = _source(
        tmp_path,
        """
setup_step slow
setup_run sleep 1.2
setup_done done
""",
    )
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"\[setup\] slow \.\.\. done \([12] s\)", result.stderr.splitlines()[1])


def test_a_failing_step_prints_the_log_tail_and_path_and_exits_with_its_status(tmp_path):
    result = _source(
        tmp_path,
        """
setup_step first
setup_run bash -c 'echo earlier-step-output'
setup_done done
setup_step failing
setup_run bash -c 'for i in $(seq 1 50); do echo line-$i; done; exit 3'
setup_done done
""",
    )
    assert result.returncode == 3
    log = _log_path(result.stderr)
    lines = _step_lines(result.stderr)
    assert lines[1:3] == ["[setup] first ... done", "[setup] failing ... failed (exit 3)"]
    # The failing step's last 40 lines, then the path.
    assert lines[3:-1] == [f"line-{i}" for i in range(11, 51)]
    assert lines[-1] == f"[setup] failing failed (exit 3); full log: {log}"
    assert "after-source" not in result.stderr
    assert "line-1\n" in pathlib.Path(log).read_text()


def test_a_short_failing_step_shows_its_command_and_not_the_earlier_steps(tmp_path):
    result = _source(
        tmp_path,
        """
setup_step first
setup_run bash -c 'echo earlier-step-output'
setup_done done
setup_step missing
setup_run ls /nonexistent-setup-step-path
""",
    )
    assert result.returncode != 0
    assert "$ ls /nonexistent-setup-step-path" in result.stderr
    assert "/nonexistent-setup-step-path" in result.stderr.splitlines()[-2]
    assert "earlier-step-output" not in result.stderr


def test_a_shell_function_is_refused(tmp_path):
    result = _source(
        tmp_path,
        """
install() { false; touch "$SETUP_LOG.marker"; }
setup_step functions
setup_run install
""",
    )
    assert result.returncode == 2
    assert "setup_run runs programs, not shell functions: install" in result.stderr
    assert not os.path.exists(_log_path(result.stderr) + ".marker")


def test_programs_do_not_inherit_the_setup_lock(tmp_path):
    """setup.sh holds its lock on fd 9; a daemon a step starts (dockerd) must not keep it held."""
    result = _source(
        tmp_path,
        f"""
exec 9>"{tmp_path}/setup.lock"
setup_step lock
setup_run bash -c 'if [ -e /proc/self/fd/9 ]; then echo fd9 open; else echo fd9 closed; fi'
setup_done done
""",
    )
    assert result.returncode == 0, result.stderr
    text = pathlib.Path(_log_path(result.stderr)).read_text()
    assert text.splitlines()[-1] == "fd9 closed"
