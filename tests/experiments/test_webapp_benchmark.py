"""The web application capsules benchmark runs end to end (--quick) and prints its ratios."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from cua_jax.envs.webapp.server import PYTHON_VARIABLE

RATIO = re.compile(r"^(create|fork|reset|throughput|memory|storage) processes/capsules \(c=2\): ([0-9.]+)x", re.M)

# A seeded state with one ticket to comment on, made with the application's own Python.
MAKE_STATE = """
import sys
from trac.env import Environment
from trac.ticket.model import Ticket
env = Environment(sys.argv[1], create=True, options=[("trac", "database", "sqlite:db/trac.db")])
env.config.set("logging", "log_type", "none")
env.config.save()
from trac.perm import PermissionSystem
PermissionSystem(env).grant_permission("anonymous", "TRAC_ADMIN")
ticket = Ticket(env)
ticket.populate({"summary": "A ticket to comment on", "reporter": "alice", "description": "x", "status": "new"})
ticket.insert()
env.shutdown()
"""


@pytest.mark.skipif(not os.environ.get(PYTHON_VARIABLE), reason=f"${PYTHON_VARIABLE} names no Trac virtualenv")
def test_quick_run_prints_positive_ratios(tmp_path, capsys):
    from experiments.benchmarks import webapp_capsules

    base = tmp_path / "base"
    subprocess.run([os.environ[PYTHON_VARIABLE], "-c", MAKE_STATE, str(base)], check=True)
    report = tmp_path / "report.json"
    webapp_capsules.main(["--base", str(base), "--quick", "--json", str(report)])  # short socket paths
    out = capsys.readouterr().out
    found = dict(RATIO.findall(out))
    assert set(found) == {"create", "fork", "reset", "throughput", "memory", "storage"}, out
    assert all(float(value) > 0 for value in found.values()), found
    assert re.search(r"with the transaction \d+, with direct publication \d+", out), out
    assert report.is_file()
