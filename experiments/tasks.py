"""Task folders: python -m experiments.tasks check DIR [--image NAME | --apps a,b] [--mirror DIR] | untouched | mirror

`check` classifies every task file under DIR (OSWorld's layout examples/<domain>/<id>.json,
or any folder cua_jax.tasks.sources reads) and prints a table: per task whether it is
runnable here and why not (cua_jax.tasks.runnable: a missing app, the network, an
unimplemented step / getter / metric; a file that breaks the schema with its error), then
per domain the counts of files, parsed, runnable and not runnable tasks, and the tasks per
reason. The apps come from probing the environment image (--image: a name under
launch/images or a full tag; one throwaway container) unless --apps lists them.

A task that starts on another image than --image (OSWorld's snapshot names: `chrome` starts on
osworld_apps) is not runnable, the reason naming the image. With the folder's untouched record
(DIR/.untouched.json, or --untouched FILE), a runnable task it flags is counted apart:
"trivially satisfied" (its setup alone passes the judge) or "untouched run failed".

`untouched DIR [--image osworld_apps] [--workers 2] [--tasks a,b] [--mirror DIR]` sets every
runnable task of DIR up for real on a pool of --workers desktops and judges it with nothing
done: each must score 0 (cua_jax.eval.untouched). Every result goes to the record as it comes
(with the task file's sha256 and the image tag), so a rerun checks only the tasks left, edited
ones and those of a rebuilt image; suites and runs leave the flagged tasks out.

`mirror --tasks DIR --out MIRROR [--base_url URL] [--workers 4] [--timeout 60] [--retries 2]`
downloads every cloud file the task files under DIR download (their download steps' URLs
and cloud_file getters' paths; not the web pages a browser opens, not commands' network use)
into the download mirror MIRROR (cua_jax.tasks.mirror: <MIRROR>/<host>/<path>, resumable
.part transfers, sha256 checks, Google Drive's confirmation page, MIRROR/manifest.json), so
that `check DIR --mirror MIRROR` counts those tasks runnable. --base_url asks
{base_url}/HOST/PATH?Q for every https://HOST/PATH?Q (a mirror server of one's own, or a
test server). Exit status: 0 when every file is mirrored, 1 when some failed (the manifest
says which and why), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import subprocess
import sys
import time
import urllib.parse
from typing import Any

from cua_jax.eval.suites import classify_task_files
from cua_jax.eval.untouched import RECORD_NAME, UntouchedRecord, flag, run_untouched
from cua_jax.tasks import mirror as M
from cua_jax.tasks import runnable as R
from cua_jax.tasks.fetch import downloads_from
from cua_jax.tasks.sources import scan_task_folder


def resolve_image(name: str) -> str:
    """The local tag of image `name`: a full tag as given, else the tag of the current
    sources (cua_jax.envs.images), else <repository>/<name>:latest; an error naming the
    build command when neither is built."""
    from cua_jax.envs import images

    if ":" in name or "/" in name:
        return name
    candidates = [images.image_tag(name), f"{images.REPOSITORY}/{name}:latest"]
    for tag in candidates:
        if images.image_exists(tag):
            return tag
    raise SystemExit(
        f"image {name!r} is not built ({' or '.join(candidates)}); build it with "
        f"`bash launch/images/build.sh {name}` or pass --apps"
    )


def classify(
    folder: str | pathlib.Path,
    image_apps: set[str] | None = None,
    image: str | None = None,
    mirror: str | None = None,
    image_name: str | None = None,
    untouched: Any = None,
) -> list[dict[str, Any]]:
    """One row per task file of `folder` (`cua_jax.eval.suites.classify_task_files`): {path,
    domain, id, status, reasons, groups}. The apps are `image_apps`, else probed in `image`
    (a tag). image_name: the image's name under launch/images (a task that starts on another
    image is not runnable). untouched: the folder's `UntouchedRecord`, whose entries for
    `image` flag runnable tasks."""
    files = scan_task_folder(folder)
    task_needs = {file.path: R.needs(file.task, mirror) for file in files if file.task is not None}
    if image_apps is None:
        names = sorted({name for found in task_needs.values() for name in R.probe_names(found)})
        image_apps = R.probe_image(image, names) if image else set()
    return classify_task_files(files, task_needs, image_apps, mirror, image_name, image, untouched)


def _table(header: list[str], lines: list[list[Any]], widths: list[int] | None = None) -> str:
    cells = [header] + [[str(c) for c in line] for line in lines]
    widths = widths or [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) if i < len(row) - 1 else c for i, (c, w) in enumerate(zip(row, widths))) for row in cells
    )


def summary(rows: list[dict[str, Any]]) -> str:
    """Per domain counts, then the tasks per reason (a task counts once per reason)."""
    domains = sorted({row["domain"] for row in rows})
    counts = {d: collections.Counter(row["status"] for row in rows if row["domain"] == d) for d in domains}
    lines = []
    for domain in domains + ["(all)"]:
        c = counts[domain] if domain != "(all)" else sum(counts.values(), collections.Counter())
        total = sum(c.values())
        flagged = c["trivially satisfied"] + c["untouched run failed"]
        lines.append(
            [domain, total, total - c["schema error"], c["runnable"], flagged, c["not runnable"], c["schema error"]]
        )
    header = ["DOMAIN", "FILES", "PARSED", "RUNNABLE", "FLAGGED UNTOUCHED", "NOT RUNNABLE", "SCHEMA ERRORS"]
    out = [_table(header, lines)]
    by_reason: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        for group in row["groups"]:
            by_reason[group][row["domain"]] += 1
    ordered = sorted(by_reason.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    reason_lines = [
        [group, sum(c.values()), ", ".join(f"{d} {n}" for d, n in sorted(c.items()))] for group, c in ordered
    ]
    out.append(_table(["REASON (tasks not runnable, flagged or not parsed)", "TASKS", "BY DOMAIN"], reason_lines))
    return "\n\n".join(out)


def _no_task_files(command: str, folder: str) -> int:
    """The error for a folder with no task file in it (exit status 2)."""
    print(
        f"{command}: {folder} holds no task files (JSON objects with an 'id', 'instruction' or 'evaluator')",
        file=sys.stderr,
    )
    return 2


def check(args: argparse.Namespace) -> int:
    apps = None
    if args.apps is not None:
        apps = {a.strip() for a in args.apps.split(",") if a.strip() and a.strip() != "none"}
    try:
        image_name = None if apps is not None or ":" in args.image or "/" in args.image else args.image
        image = None if apps is not None else resolve_image(args.image)
        record = UntouchedRecord(args.folder, args.untouched) if pathlib.Path(args.folder).is_dir() else None
        rows = classify(args.folder, apps, image, args.mirror, image_name, record)
    except (FileNotFoundError, RuntimeError, subprocess.SubprocessError) as error:
        print(f"check: {error}", file=sys.stderr)
        return 2
    if not rows:
        return _no_task_files("check", args.folder)
    if not args.summary:
        root = pathlib.Path(args.folder)
        lines = [
            [pathlib.Path(row["path"]).relative_to(root), row["status"], "; ".join(row["reasons"])] for row in rows
        ]
        print(_table(["TASK FILE", "STATUS", "WHY NOT"], lines))
        print()
    print(summary(rows))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def untouched(args: argparse.Namespace) -> int:
    """`untouched DIR`: every runnable task of DIR (on --image) set up on a pool of --workers
    desktops and judged with nothing done; the record (FOLDER/.untouched.json) gains each
    result as it comes, so a run started again checks only what is left (and edited tasks)."""
    from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig

    if args.workers < 1:
        print(f"untouched: --workers must be at least 1, got {args.workers}", file=sys.stderr)
        return 2
    try:
        image = resolve_image(args.image)
        rows = classify(args.folder, None, image, args.mirror, args.image)
    except (FileNotFoundError, RuntimeError, subprocess.SubprocessError) as error:
        print(f"untouched: {error}", file=sys.stderr)
        return 2
    if not rows:
        return _no_task_files("untouched", args.folder)
    wanted = {t.strip() for t in args.tasks.split(",") if t.strip()}
    files = {str(file.path): file.task for file in scan_task_folder(args.folder) if file.task is not None}
    chosen = [(row["path"], files[row["path"]]) for row in rows if row["status"] == "runnable"]
    chosen = [(path, task) for path, task in chosen if not wanted or task.id in wanted]
    record = UntouchedRecord(args.folder, args.untouched)
    left = [(path, task) for path, task in chosen if record.entry(path, image) is None]
    print(f"untouched: {len(chosen)} runnable tasks on {image}, {len(left)} to check, {args.workers} at a time")
    started = time.monotonic()

    def report(path: str, result: dict[str, Any]) -> None:
        flagged = flag(result)
        print(
            f"  {pathlib.Path(path).relative_to(args.folder)}  {result['status']} {result['reward']:g}  "
            f"start {result['start_s']:.1f} s, judge {result['judge_s']:.1f} s" + (f"  ({flagged})" if flagged else ""),
            flush=True,
        )

    config = PoolConfig(image=image, size=args.workers, cpus=1.0, memory="2g", call_timeout=120.0)
    with downloads_from(args.mirror), DockerEnvPool(config) as pool:  # the setups read the mirror
        run_untouched(pool, left, record, image, args.workers, report)
    flags = {path: record.flag(path, image) for path, _ in chosen}
    flagged = {path: why for path, why in flags.items() if why}
    print(
        f"untouched: {len(chosen) - len(flagged)} of {len(chosen)} score 0 untouched, {len(flagged)} flagged, "
        f"{time.monotonic() - started:.0f} s; record: {record.path}"
    )
    for path, why in sorted(flagged.items()):
        print(f"  {pathlib.Path(path).relative_to(args.folder)}: {why}")
    return 0


def _mirror_argument_problem(args: argparse.Namespace) -> str | None:
    if args.workers < 1:
        return f"--workers must be at least 1, got {args.workers}"
    if args.timeout <= 0:
        return f"--timeout must be more than 0 seconds, got {args.timeout:g}"
    if args.retries < 0:
        return f"--retries must be 0 or more, got {args.retries}"
    if args.base_url is not None:
        parsed = urllib.parse.urlsplit(args.base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.query:
            return (
                f"--base_url must be an http(s) URL without a query, like http://127.0.0.1:8000, got {args.base_url!r}"
            )
    if pathlib.Path(args.out).expanduser().exists() and not pathlib.Path(args.out).expanduser().is_dir():
        return f"--out {args.out!r} is a file, not a folder"
    return None


def mirror(args: argparse.Namespace) -> int:
    problem = _mirror_argument_problem(args)
    if problem:
        print(f"mirror: {problem}", file=sys.stderr)
        return 2
    try:
        files = scan_task_folder(args.tasks)
    except FileNotFoundError as error:
        print(f"mirror: {error}", file=sys.stderr)
        return 2
    if not files:
        return _no_task_files("mirror", args.tasks)
    root = pathlib.Path(args.tasks)
    sources: dict[str, list[str]] = {}  # URL -> the task files naming it
    for file in files:
        for url in R.download_urls(file.task) if file.task is not None else ():
            sources.setdefault(url, []).append(file.path.relative_to(root).as_posix())
    broken = sum(file.task is None for file in files)
    if broken:
        print(f"mirror: {broken} task files break the schema and are left out (`check {args.tasks}` says why)")
    if not sources:
        print(f"mirror: the {len(files) - broken} task files under {args.tasks} download no cloud files")
        return 0
    started = time.monotonic()
    try:
        outcomes = M.mirror_urls(sources, args.out, args.base_url, args.workers, args.timeout, args.retries)
    except ValueError as error:  # an unreadable manifest
        print(f"mirror: {error}", file=sys.stderr)
        return 2
    counts = collections.Counter(outcome.status for outcome in outcomes)
    fetched_bytes = sum(outcome.bytes for outcome in outcomes if outcome.status == "fetched")
    print(
        f"\nmirror: {len(outcomes)} URLs of {len(files) - broken} task files into {args.out} in "
        f"{time.monotonic() - started:.1f} s: {counts['fetched']} fetched ({fetched_bytes:,} bytes), "
        f"{counts['skipped']} already mirrored, {counts['failed']} failed"
    )
    failures = collections.Counter(outcome.reason for outcome in outcomes if outcome.status == "failed")
    if failures:
        reasons = ", ".join(f"{reason} {n}" for reason, n in failures.most_common())
        print(f"failures by reason: {reasons}; {pathlib.Path(args.out) / M.MANIFEST} lists them")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.tasks", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    checker = commands.add_parser("check", help="classify every task file of a folder: runnable here or why not")
    checker.add_argument("folder", help="a task folder, e.g. OSWorld's evaluation_examples/examples")
    checker.add_argument(
        "--image",
        default="desktop",
        help="the environment image whose apps count: a name under launch/images or a full tag",
    )
    checker.add_argument(
        "--apps",
        help="comma-separated apps (and interpreter:module names) instead of probing the image; 'none' for no app",
    )
    checker.add_argument("--mirror", help="the download mirror folder (default: $CUA_JAX_DOWNLOAD_MIRROR)")
    checker.add_argument("--summary", action="store_true", help="print only the per-domain and per-reason tables")
    checker.add_argument("--json", help="also write the rows as JSON to this file")
    mirrorer = commands.add_parser(
        "mirror", help="download the cloud files a folder's tasks download into a download mirror"
    )
    mirrorer.add_argument("--tasks", required=True, help="a task folder, e.g. OSWorld's evaluation_examples/examples")
    mirrorer.add_argument("--out", required=True, help="the download mirror folder (created when missing)")
    mirrorer.add_argument(
        "--base_url",
        help="ask {base_url}/HOST/PATH?Q for every https://HOST/PATH?Q (a mirror server of one's own, a test server)",
    )
    mirrorer.add_argument("--workers", type=int, default=4, help="files downloaded at once")
    mirrorer.add_argument("--timeout", type=float, default=60.0, help="seconds without an answer before giving up")
    mirrorer.add_argument(
        "--retries",
        type=int,
        default=2,
        help="further attempts after a timeout, a cut transfer, a connection error, an HTTP 5xx or 429",
    )
    checker.add_argument(
        "--untouched",
        help=f"the folder's untouched record (default: FOLDER/{RECORD_NAME}, when `untouched` wrote one)",
    )
    toucher = commands.add_parser(
        "untouched",
        help="set every runnable task of a folder up for real and judge it untouched: it must score 0",
    )
    toucher.add_argument("folder", help="a task folder, e.g. OSWorld's evaluation_examples/examples")
    toucher.add_argument("--image", default="osworld_apps", help="the environment image: a name under launch/images")
    toucher.add_argument("--mirror", help="the download mirror folder (default: $CUA_JAX_DOWNLOAD_MIRROR)")
    toucher.add_argument("--workers", type=int, default=2, help="tasks set up and judged at once (one container each)")
    toucher.add_argument("--tasks", default="", help="comma-separated task ids: only these (default: every runnable)")
    toucher.add_argument("--untouched", help=f"the record to write (default: FOLDER/{RECORD_NAME})")
    args = parser.parse_args(argv)
    return {"check": check, "mirror": mirror, "untouched": untouched}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
