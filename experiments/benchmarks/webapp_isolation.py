"""Isolation of web application capsules that share one application server: trials of
concurrent writes, each capsule writing through its own route while the others write too,
with a capsule reset to a new generation every few trials.

    python -m experiments.benchmarks.webapp_isolation [--capsules 8] [--trials 100]

Each trial, every capsule's writer creates one wiki page named after the capsule, its
generation and the trial, at the same moment (a barrier), over HTTP as its page would send it
(the capsule's site as Host, its route token, a form token). Then every capsule's database is
read: it must hold exactly the pages its current generation was sent, no other capsule's and
none of its earlier generations'. Every `--reset_every` trials one capsule (in turn) is reset:
its new generation starts from the seeded state. A page found where it was not sent, or
missing where it was acknowledged, is a crossing; the run prints their count (0 expected).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import secrets
import sqlite3
import tempfile
import threading
import time
import urllib.parse

from cua_jax.envs.webapp.runtime import WebappRuntime
from cua_jax.envs.webapp.state import ensure_base_state
from cua_jax.envs.webapp.tasks import parse_task

ROUTE_HEADER = "X-Cua-Route"
TASK = parse_task({"task_id": "isolation", "intent": "-", "start_url": "/wiki", "eval": {"eval_types": ["db_diff"],
                   "db_diff": {"must": [], "may": []}}})  # fmt: skip


def write_page(port: int, site: str, route: str, page: str) -> int:
    """Create wiki page `page` through `route`, as a browser on `site` would; the HTTP status."""
    token = secrets.token_hex(12)
    body = urllib.parse.urlencode(
        {"__FORM_TOKEN": token, "action": "edit", "version": "0", "text": page, "save": "Submit changes"}
    )
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        headers = {
            "Host": site,
            ROUTE_HEADER: route,
            "Cookie": f"trac_form_token={token}",
            "Content-Type": "application/x-www-form-urlencoded",
        }
        connection.request("POST", f"/wiki/{page}", body, headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def isolation_pages(database) -> set[str]:
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        return {name for (name,) in db.execute("SELECT DISTINCT name FROM wiki WHERE name LIKE 'Iso%'")}


def _write(runtime: WebappRuntime, env: str, trial: int, barrier, statuses: dict, sent: set) -> None:
    """One capsule's write of a trial: released with the others' by `barrier`."""
    site, route = runtime.route_of(env)
    page = f"Iso{env.upper()}G{runtime.generation_of(env)}T{trial}"
    barrier.wait()
    statuses[page] = write_page(runtime.server.port, site, route, page)
    if statuses[page] in (200, 303):
        sent.add(page)


def run_trials(runtime: WebappRuntime, capsules: int, trials: int, reset_every: int) -> dict[str, int]:
    envs = [runtime.create(TASK) for _ in range(capsules)]
    sent: dict[str, set[str]] = {env: set() for env in envs}  # pages the current generation acknowledged
    crossings = writes = refused = resets = 0
    try:
        for trial in range(trials):
            barrier = threading.Barrier(capsules)
            statuses: dict[str, int] = {}
            threads = [
                threading.Thread(target=_write, args=(runtime, env, trial, barrier, statuses, sent[env]))
                for env in envs
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            writes += len(statuses)
            refused += sum(status not in (200, 303) for status in statuses.values())
            for env in envs:
                crossings += len(isolation_pages(runtime.database(env)) ^ sent[env])
            if reset_every and (trial + 1) % reset_every == 0:
                env = envs[resets % capsules]
                runtime.reset(env)
                sent[env] = set()
                resets += 1
                crossings += len(isolation_pages(runtime.database(env)))  # a new generation starts clean
    finally:
        for env in envs:
            runtime.close(env)
    return {"trials": trials, "writes": writes, "refused": refused, "resets": resets, "crossings": crossings}


def main(argv=None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capsules", type=int, default=8)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--reset_every", type=int, default=10)
    parser.add_argument("--scale", default="test")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cua-iso-") as workdir:
        with WebappRuntime(ensure_base_state(args.scale), workdir) as runtime:
            result = run_trials(runtime, args.capsules, args.trials, args.reset_every)
    print(
        f"{result['trials']} trials, {args.capsules} capsules on one server: {result['writes']} concurrent writes "
        f"({result['refused']} refused), {result['resets']} resets; writes crossing capsules or generations: "
        f"{result['crossings']} ({time.perf_counter() - started:.0f} s)"
    )
    return result


if __name__ == "__main__":
    main()
