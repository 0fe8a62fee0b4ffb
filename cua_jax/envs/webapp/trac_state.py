# Single job: build the deterministic seeded base state of the Trac web application.
"""The seeded base state of the Trac 1.6 application: one Trac environment directory (SQLite
database + attachment files) that every capsule branches from.

It runs under the application's own Python (the one with `trac` installed), so it imports
nothing from cua_jax:

    <app-python> cua_jax/envs/webapp/trac_state.py build --out DIR --scale {test,bench}
    <app-python> cua_jax/envs/webapp/trac_state.py digest DIR

The content is a pure function of the scale: every random choice comes from a
`random.Random` with a fixed seed and every timestamp from a fixed epoch, never the wall clock.
Building twice gives equal `content_digest`s.

Both scales share the *named* entities that tasks refer to (tickets 1..NAMED_TICKET_COUNT,
the named wiki pages, milestones, components, versions, users): they are generated first, from
their own random stream, so the scale cannot change them. The bulk filler that follows (more
tickets, change history, wiki pages, attachments) only gives the `bench` scale its size, and it
never uses the named-only milestones, components or keywords (NAMED_ONLY_*), so counts over
those are the same at both scales.
"""

import argparse
import hashlib
import os
import random
import sqlite3
import sys
import time
from dataclasses import dataclass

# Bump whenever the built content changes, so callers caching a base state rebuild it.
BUILDER_VERSION = 1

SEED = 20240611
# 2024-01-01T00:00:00Z in microseconds: Trac stores times as integer microseconds since 1970.
EPOCH_US = 1_704_067_200 * 1_000_000
HOUR_US = 3_600 * 1_000_000
DAY_US = 24 * HOUR_US

PROJECT_NAME = "Acme Platform"
PROJECT_DESCRIPTION = "Issue tracker and wiki of the Acme Platform team"

USERS = (
    "alice",
    "bob",
    "carol",
    "dave",
    "erin",
    "frank",
    "grace",
    "heidi",
    "ivan",
    "judy",
    "mallory",
    "oscar",
)

# (name, owner, description)
COMPONENTS = (
    ("api", "alice", "Public REST API and client SDKs"),
    ("auth", "bob", "Login, single sign-on and access tokens"),
    ("billing", "carol", "Invoices, payment providers and plans"),
    ("docs", "dave", "User and developer documentation"),
    ("frontend", "erin", "Web application user interface"),
    ("infrastructure", "frank", "Deployment, monitoring and databases"),
    ("mobile", "grace", "iOS and Android applications"),
    ("search", "heidi", "Indexing and full-text search"),
)

# (name, due offset in days from EPOCH or None, completed offset in days or None, description)
MILESTONES = (
    ("1.0-alpha", 30, 32, "First internal release."),
    ("1.0-beta", 75, 80, "Public beta with the billing module."),
    ("1.0", 140, None, "General availability."),
    ("1.1", 200, None, "Search improvements and the mobile applications."),
    ("2.0", 320, None, "Multi-tenant platform."),
    ("backlog", None, None, "Accepted work that is not scheduled yet."),
)

# (name, time offset in days)
VERSIONS = (("0.9", 20), ("1.0", 120), ("1.1", 190))

PRIORITIES = ("blocker", "critical", "major", "minor", "trivial")
TICKET_TYPES = ("defect", "enhancement", "task")
RESOLUTIONS = ("fixed", "invalid", "wontfix", "duplicate", "worksforme")

# The bulk filler only ever uses these, so questions about the others stay scale-independent.
FILLER_COMPONENTS = ("api", "frontend", "infrastructure", "mobile")
FILLER_MILESTONES = ("2.0", "backlog")
FILLER_KEYWORDS = ("perf", "ux", "regression", "cleanup", "flaky")
NAMED_ONLY_COMPONENTS = tuple(c[0] for c in COMPONENTS if c[0] not in FILLER_COMPONENTS)
NAMED_ONLY_MILESTONES = tuple(m[0] for m in MILESTONES if m[0] not in FILLER_MILESTONES)

PERMISSIONS_ANONYMOUS = (
    "TICKET_ADMIN",
    "WIKI_ADMIN",
    "MILESTONE_ADMIN",
    "REPORT_ADMIN",
    "ROADMAP_VIEW",
    "TIMELINE_VIEW",
    "SEARCH_VIEW",
    "BROWSER_VIEW",
    # Trac's default view permissions of anonymous, kept.
    "LOG_VIEW",
    "FILE_VIEW",
    "WIKI_VIEW",
    "REPORT_VIEW",
    "REPORT_SQL_VIEW",
    "TICKET_VIEW",
    "CHANGESET_VIEW",
    "MILESTONE_VIEW",
)

# The summaries of the named tickets 1..N, in id order; ticket i belongs to component
# NAMED_COMPONENT_CYCLE[(i - 1) % 8] (the summaries are written in that cycle), and its other fields
# come from the named random stream (see _named_tickets).
NAMED_COMPONENT_CYCLE = ("auth", "billing", "api", "search", "frontend", "docs", "mobile", "infrastructure")
NAMED_SUMMARIES = (
    "Login page rejects passwords containing a colon",
    "Invoice PDF shows the wrong currency symbol for CHF",
    "Add rate limiting headers to every API response",
    "Search results ignore the language filter",
    "Dashboard charts flicker when the window is resized",
    "Document the webhook retry policy",
    "Android app crashes when the camera permission is denied",
    "Database backups are not rotated on the staging cluster",
    "Single sign-on fails for users with uppercase e-mail addresses",
    "Proration is computed twice when a plan is upgraded mid-cycle",
    "Paginate the /v2/projects endpoint",
    "Index attachments of tickets for full-text search",
    "Dark mode colours for the settings page",
    "Write a migration guide from 0.9 to 1.0",
    "Push notifications arrive twice on iOS",
    "Alert when disk usage on the log servers exceeds 80 percent",
    "Password reset e-mail links expire after five minutes",
    "Refunds are not reflected in the monthly revenue report",
    "API returns 500 instead of 404 for unknown resources",
    "Search suggestions are case sensitive",
    "Keyboard navigation skips the date picker",
    "Typo in the quick start tutorial",
    "Offline mode loses unsynchronised edits",
    "Upgrade the load balancer certificates before they expire",
    "Two-factor authentication codes accepted twice",
    "Support SEPA direct debit as a payment method",
    "Add an OpenAPI description of the public API",
    "Reindexing blocks writes for several minutes",
    "Table header stays hidden after scrolling back up",
    "Explain the permission model in the administrator guide",
    "Tablet layout wastes half of the screen",
    "Nightly job fails when the metrics database is read-only",
    "Session cookie is missing the SameSite attribute",
    "Trial accounts are charged before the trial ends",
    "Deprecate the v1 export endpoint",
    "Highlight matched words in search results",
    "Form errors are not announced by screen readers",
    "Broken links in the API reference",
    "Crash when rotating the device during video upload",
    "Move the build agents to the new network segment",
    "Lock accounts after ten failed login attempts",
    "Tax rates for Norway are outdated",
    "Return ETag headers for cacheable responses",
    "Fuzzy matching for misspelled product names",
    "Loading spinner never stops on slow connections",
    "Add a glossary to the user guide",
    "Biometric login on Android",
    "Centralise application logs in one index",
)
NAMED_TICKET_COUNT = len(NAMED_SUMMARIES)

# The named wiki pages: (name, [(author, comment, text), ...] one entry per version, oldest first).
NAMED_WIKI_PAGES = (
    (
        "ReleaseProcess",
        [
            ("alice", "First draft", "= Release process =\n\n 1. Freeze the milestone.\n 1. Tag the release.\n"),
            (
                "bob",
                "Add the smoke test step",
                "= Release process =\n\n 1. Freeze the milestone.\n 1. Run the smoke tests on staging.\n"
                " 1. Tag the release.\n",
            ),
            (
                "alice",
                "Mention the announcement",
                "= Release process =\n\n 1. Freeze the milestone.\n 1. Run the smoke tests on staging.\n"
                " 1. Tag the release.\n 1. Announce the release on the mailing list.\n\n"
                "The release manager for 1.0 is alice.\n",
            ),
        ],
    ),
    (
        "OnCallRotation",
        [
            ("frank", "Create the rotation", "= On-call rotation =\n\n|| Week || Engineer ||\n|| 1 || frank ||\n"),
            (
                "frank",
                "Add weeks 2 and 3",
                "= On-call rotation =\n\n|| Week || Engineer ||\n|| 1 || frank ||\n|| 2 || ivan ||\n|| 3 || judy ||\n",
            ),
        ],
    ),
    (
        "CodingStandards",
        [
            (
                "carol",
                "Initial version",
                "= Coding standards =\n\n * Python code is formatted with a line length of 100.\n"
                " * Every public function has a docstring.\n",
            ),
        ],
    ),
    (
        "TeamContacts",
        [
            (
                "dave",
                "",
                "= Team contacts =\n\n * API: alice\n * Authentication: bob\n * Billing: carol\n"
                " * Documentation: dave\n",
            ),
            (
                "erin",
                "Add the frontend and infrastructure leads",
                "= Team contacts =\n\n * API: alice\n * Authentication: bob\n * Billing: carol\n"
                " * Documentation: dave\n * Frontend: erin\n * Infrastructure: frank\n",
            ),
            (
                "grace",
                "Add mobile and search",
                "= Team contacts =\n\n * API: alice\n * Authentication: bob\n * Billing: carol\n"
                " * Documentation: dave\n * Frontend: erin\n * Infrastructure: frank\n * Mobile: grace\n"
                " * Search: heidi\n",
            ),
        ],
    ),
    (
        "IncidentRunbook",
        [
            (
                "ivan",
                "Runbook for production incidents",
                "= Incident runbook =\n\n 1. Acknowledge the page within 15 minutes.\n"
                " 1. Open a ticket in component infrastructure.\n 1. Post updates every 30 minutes.\n",
            ),
        ],
    ),
    (
        "MeetingNotes/2024-03-04",
        [
            (
                "judy",
                "Notes of the planning meeting",
                "= Planning meeting 2024-03-04 =\n\n * Decided to ship 1.0 without SEPA support.\n"
                " * Next meeting: 2024-03-18.\n",
            ),
            (
                "oscar",
                "Add action items",
                "= Planning meeting 2024-03-04 =\n\n * Decided to ship 1.0 without SEPA support.\n"
                " * Next meeting: 2024-03-18.\n\n== Action items ==\n * carol: update the billing roadmap\n",
            ),
        ],
    ),
)

# Small text attachments of named entities: (realm, parent id, filename, author, description, text).
NAMED_ATTACHMENTS = (
    ("ticket", "1", "login-error.log", "bob", "Server log of the failed login", "ERROR auth: invalid credentials\n"),
    ("ticket", "2", "invoice-1042.txt", "carol", "The invoice as rendered", "Invoice 1042\nTotal: 120.00 $\n"),
    ("ticket", "8", "backup-cron.patch", "frank", "Proposed rotation", "--- a/cron\n+++ b/cron\n+0 3 * * * rotate\n"),
    ("ticket", "19", "trace.txt", "alice", "Stack trace of the 500", "Traceback: KeyError 'resource'\n"),
    ("wiki", "ReleaseProcess", "checklist.txt", "alice", "Release checklist", "[ ] freeze\n[ ] smoke tests\n"),
)

WORDS = (
    "the a an of to in for on with when after before while during under over between user users "
    "server client request response page pages button form field value values error errors warning "
    "timeout cache index query report ticket tickets invoice payment account session token login "
    "logout password email address browser mobile tablet screen layout chart table row column "
    "filter search result results build deploy release staging production database backup log logs "
    "metric metrics alert alerts latency throughput memory disk network proxy certificate "
    "configuration setting settings option default fails failed works broken slow fast correct "
    "incorrect missing duplicate invalid unexpected shows returns ignores crashes hangs retries "
    "should must could would does not always never sometimes only again still also however because "
    "then so therefore this that these those it they we our their customer team review patch "
    "upgrade migration version documentation guide example test tests coverage flaky regression"
).split()


@dataclass(frozen=True)
class Scale:
    """How much bulk filler follows the named entities."""

    filler_tickets: int
    filler_description_words: tuple[int, int]  # (min, max) words of a filler ticket's description
    filler_changes: tuple[int, int]  # (min, max) change events of a filler ticket
    filler_wiki_pages: int
    filler_attachments: int
    filler_attachment_bytes: tuple[int, int]  # (min, max) size of a filler attachment


SCALES = {
    "test": Scale(
        filler_tickets=250,
        filler_description_words=(40, 160),
        filler_changes=(0, 4),
        filler_wiki_pages=20,
        filler_attachments=20,
        filler_attachment_bytes=(1_000, 40_000),
    ),
    "bench": Scale(
        filler_tickets=30_000,
        filler_description_words=(250, 650),
        filler_changes=(2, 8),
        filler_wiki_pages=2_000,
        filler_attachments=420,
        filler_attachment_bytes=(400_000, 2_400_000),
    ),
}

# Tables a page view or Trac's own bookkeeping writes to, whose rows are no part of the
# application's content (judges ignore them; the digest leaves them out too).
EPHEMERAL_TABLES = ("session", "session_attribute", "auth_cookie", "cache")


def _ts(offset_us: int) -> int:
    return EPOCH_US + offset_us


def _sentence(rng: random.Random, n_words: int) -> str:
    words = rng.choices(WORDS, k=n_words)
    return " ".join(words).capitalize() + "."


def _paragraphs(rng: random.Random, n_words: int) -> str:
    """About n_words of deterministic prose in wiki markup, broken into sentences and paragraphs.

    Lines end in CRLF, as a browser submits a textarea and Trac stores it: a form that resubmits
    the text unchanged then leaves it unchanged."""
    parts, left = [], n_words
    while left > 0:
        n = min(left, rng.randint(8, 24))
        parts.append(_sentence(rng, n))
        left -= n
        if rng.random() < 0.2:
            parts.append("\n\n")
    return " ".join(parts).replace(" \n\n ", "\r\n\r\n").strip()


def _create_environment(out_dir: str) -> None:
    from trac.env import Environment  # the application's package: only importable under its Python

    options = [
        ("project", "name", PROJECT_NAME),
        ("project", "descr", PROJECT_DESCRIPTION),
        ("trac", "database", "sqlite:db/trac.db"),
        ("trac", "base_url", ""),
        # Offline and deterministic: no mail, no repository, no log file growing per request.
        ("notification", "smtp_enabled", "false"),
        ("logging", "log_type", "none"),
        ("trac", "repository_sync_per_request", ""),
        ("attachment", "max_size", "262144"),
        # The ticket owner is a free text field (no user list to select from).
        ("ticket", "restrict_owner", "false"),
    ]
    env = Environment(out_dir, create=True, options=options)
    env.shutdown()


def _reset_defaults(db: sqlite3.Connection) -> None:
    """Replace Trac's example components/milestones/versions and pin the default wiki pages' times."""
    db.execute("DELETE FROM component")
    db.execute("DELETE FROM milestone")
    db.execute("DELETE FROM version")
    # The default pages are stamped with the wall clock at creation: pin them to the epoch.
    db.execute("UPDATE wiki SET time=?", (EPOCH_US,))
    db.executemany("INSERT INTO component VALUES (?,?,?)", COMPONENTS)
    db.executemany(
        "INSERT INTO milestone VALUES (?,?,?,?)",
        [
            (name, _ts(due * DAY_US) if due is not None else 0, _ts(done * DAY_US) if done is not None else 0, text)
            for name, due, done, text in MILESTONES
        ],
    )
    db.executemany("INSERT INTO version VALUES (?,?,?)", [(n, _ts(d * DAY_US), "") for n, d in VERSIONS])
    db.execute("DELETE FROM permission WHERE username='anonymous'")
    db.executemany("INSERT INTO permission VALUES ('anonymous', ?)", [(p,) for p in PERMISSIONS_ANONYMOUS])


@dataclass
class _Ticket:
    id: int
    type: str
    time: int
    component: str
    priority: str
    owner: str
    reporter: str
    cc: str
    version: str
    milestone: str
    status: str
    resolution: str
    summary: str
    description: str
    keywords: str


def _history(rng: random.Random, t: _Ticket, n_events: int, comment_words: tuple[int, int]) -> tuple[list, int]:
    """Change events ending in the ticket's final status/resolution/owner.

    Returns (ticket_change rows, changetime). Every event has a 'comment' row, as Trac writes one
    per change group (empty text for field-only changes)."""
    rows = []
    when = t.time
    # The status path that leads to the final status, from 'new'.
    path = {
        "new": [],
        "assigned": [("status", "new", "assigned")],
        "accepted": [("status", "new", "accepted")],
        "closed": [("status", "new", "closed"), ("resolution", "", t.resolution)],
        "reopened": [
            ("status", "new", "closed"),
            ("resolution", "", "fixed"),
            ("status", "closed", "reopened"),
            ("resolution", "fixed", ""),
        ],
    }[t.status]
    # Group the path into events of (status[, resolution]) changes.
    status_events = []
    i = 0
    while i < len(path):
        group = [path[i]]
        if i + 1 < len(path) and path[i + 1][0] == "resolution":
            group.append(path[i + 1])
            i += 1
        status_events.append(group)
        i += 1
    n_comments = max(0, n_events - len(status_events))
    events = [("comment", None)] * n_comments + [("status", g) for g in status_events]
    # Comments come first, then the status changes in order: the history ends in the final state.
    for cnum, (kind, group) in enumerate(events, start=1):
        when += rng.randint(1, 72) * HOUR_US + rng.randint(0, 3_599) * 1_000_000
        author = rng.choice(USERS)
        text = ""
        if kind == "comment" or rng.random() < 0.5:
            text = _paragraphs(rng, rng.randint(*comment_words))
        rows.append((t.id, when, author, "comment", str(cnum), text))
        if kind == "status":
            for field, old, new in group:
                rows.append((t.id, when, author, field, old, new))
    return rows, when


def _random_ticket(
    rng: random.Random, ticket_id: int, summary: str, when: int, description_words: int, components, milestones
) -> _Ticket:
    status = rng.choices(["new", "assigned", "accepted", "reopened", "closed"], weights=[3, 2, 2, 1, 4])[0]
    resolution = rng.choice(RESOLUTIONS) if status == "closed" else ""
    owner = rng.choice(USERS)
    cc = ", ".join(sorted(rng.sample(USERS, rng.randint(0, 2))))
    return _Ticket(
        id=ticket_id,
        type=rng.choice(TICKET_TYPES),
        time=when,
        component=rng.choice(components),
        priority=rng.choices(PRIORITIES, weights=[1, 2, 5, 3, 1])[0],
        owner=owner,
        reporter=rng.choice(USERS),
        cc=cc,
        version=rng.choice(["", *[v[0] for v in VERSIONS]]),
        milestone=rng.choice(milestones),
        status=status,
        resolution=resolution,
        summary=summary,
        description=_paragraphs(rng, description_words),
        keywords="",
    )


def _insert_tickets(db: sqlite3.Connection, tickets_with_history) -> None:
    db.executemany(
        "INSERT INTO ticket (id, type, time, changetime, component, severity, priority, owner, reporter, cc,"
        " version, milestone, status, resolution, summary, description, keywords)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [
            (
                t.id,
                t.type,
                t.time,
                changetime,
                t.component,
                "",
                t.priority,
                t.owner,
                t.reporter,
                t.cc,
                t.version,
                t.milestone,
                t.status,
                t.resolution,
                t.summary,
                t.description,
                t.keywords,
            )
            for t, _, changetime in tickets_with_history
        ],
    )
    db.executemany(
        "INSERT INTO ticket_change VALUES (?,?,?,?,?,?)", [row for _, rows, _ in tickets_with_history for row in rows]
    )


def _named_tickets(rng: random.Random) -> list:
    milestone_names = [m[0] for m in MILESTONES]
    keyword_pool = ("security", "customer", "i18n", "accessibility", "perf", "ux")
    out = []
    for i, summary in enumerate(NAMED_SUMMARIES, start=1):
        when = EPOCH_US + i * 9 * HOUR_US + rng.randint(0, 3_599) * 1_000_000
        t = _random_ticket(rng, i, summary, when, rng.randint(30, 90), NAMED_COMPONENT_CYCLE, milestone_names)
        t.keywords = " ".join(sorted(rng.sample(keyword_pool, rng.randint(0, 2))))
        t.component = NAMED_COMPONENT_CYCLE[(i - 1) % len(NAMED_COMPONENT_CYCLE)]
        # Tickets of completed milestones are closed: the roadmap of a finished release is done.
        if t.milestone in ("1.0-alpha", "1.0-beta") and t.status != "closed":
            t.status, t.resolution = "closed", "fixed"
        rows, changetime = _history(rng, t, rng.randint(1, 4), (8, 40))
        out.append((t, rows, changetime))
    return out


def _filler_tickets(rng: random.Random, scale: Scale) -> list:
    out = []
    start = EPOCH_US + 60 * DAY_US
    for i in range(scale.filler_tickets):
        ticket_id = NAMED_TICKET_COUNT + 1 + i
        when = start + i * 600 * 1_000_000 + rng.randint(0, 599) * 1_000_000
        summary = _sentence(rng, rng.randint(4, 9))[:-1]
        t = _random_ticket(
            rng,
            ticket_id,
            summary,
            when,
            rng.randint(*scale.filler_description_words),
            FILLER_COMPONENTS,
            FILLER_MILESTONES,
        )
        t.keywords = rng.choice(("", "", *FILLER_KEYWORDS))
        lo, hi = scale.filler_description_words
        rows, changetime = _history(rng, t, rng.randint(*scale.filler_changes), (lo // 4, hi // 4))
        out.append((t, rows, changetime))
    return out


def _insert_named_wiki(db: sqlite3.Connection, rng: random.Random) -> None:
    rows = []
    for p, (name, versions) in enumerate(NAMED_WIKI_PAGES):
        when = EPOCH_US + (p + 1) * DAY_US
        for v, (author, comment, text) in enumerate(versions, start=1):
            when += rng.randint(1, 240) * HOUR_US
            rows.append((name, v, when, author, text, comment, 0))
    db.executemany("INSERT INTO wiki VALUES (?,?,?,?,?,?,?)", rows)


def attachment_path(env_dir: str, realm: str, parent_id: str, filename: str) -> str:
    """Where Trac 1.6 keeps an attachment's file (trac.attachment.Attachment._get_path): the sha1 of
    the parent id (3-character fan-out directory, then the full hash), then the sha1 of the file name
    with the name's extension kept."""
    parent_hash = hashlib.sha1(parent_id.encode("utf-8")).hexdigest()
    name_hash = hashlib.sha1(filename.encode("utf-8")).hexdigest()
    ext = os.path.splitext(filename)[1]
    if ext and not ext[1:].isalnum():
        ext = ""
    return os.path.join(env_dir, "files", "attachments", realm, parent_hash[:3], parent_hash, name_hash + ext)


def _write_attachment(env_dir: str, realm: str, parent_id: str, filename: str, data: bytes) -> None:
    path = attachment_path(env_dir, realm, parent_id, filename)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _insert_named_attachments(db: sqlite3.Connection, env_dir: str) -> None:
    rows = []
    for k, (realm, parent_id, filename, author, description, text) in enumerate(NAMED_ATTACHMENTS):
        data = text.encode()
        _write_attachment(env_dir, realm, parent_id, filename, data)
        rows.append((realm, parent_id, filename, len(data), EPOCH_US + (k + 1) * 5 * DAY_US, description, author))
    db.executemany("INSERT INTO attachment VALUES (?,?,?,?,?,?,?)", rows)


def build(out_dir: str, scale_name: str) -> None:
    """Build the base state of `scale_name` into `out_dir` (absent or empty)."""
    if scale_name not in SCALES:
        raise ValueError(f"unknown scale {scale_name!r}: expected one of {sorted(SCALES)}")
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise FileExistsError(f"refusing to build into non-empty directory {out_dir}")
    if os.path.exists(out_dir):
        os.rmdir(out_dir)  # Trac's create wants to make the directory itself
    scale = SCALES[scale_name]
    _create_environment(out_dir)
    db = sqlite3.connect(os.path.join(out_dir, "db", "trac.db"))
    db.execute("PRAGMA synchronous=OFF")
    db.execute("PRAGMA journal_mode=MEMORY")
    with db:
        _reset_defaults(db)
        # Named entities first, from their own stream: the scale cannot change them.
        named_rng = random.Random(SEED)
        _insert_tickets(db, _named_tickets(named_rng))
        _insert_named_wiki(db, random.Random(SEED + 1))
        _insert_named_attachments(db, out_dir)
    with db:
        filler_rng = random.Random(SEED + 100)
        _insert_tickets(db, _filler_tickets(filler_rng, scale))
        _insert_filler_wiki(db, random.Random(SEED + 101), scale)
        _insert_filler_attachments(db, out_dir, random.Random(SEED + 102), scale)
    db.execute("VACUUM")
    db.close()


def _insert_filler_wiki(db: sqlite3.Connection, rng: random.Random, scale: Scale) -> None:
    rows = []
    for i in range(scale.filler_wiki_pages):
        name = f"KnowledgeBase/Article{i + 1:04d}"
        when = EPOCH_US + 90 * DAY_US + i * HOUR_US
        for v in range(1, rng.randint(1, 3) + 1):
            when += rng.randint(1, 48) * HOUR_US
            text = f"= {_sentence(rng, 5)[:-1]} =\n\n{_paragraphs(rng, rng.randint(80, 400))}\n"
            rows.append((name, v, when, rng.choice(USERS), text, _sentence(rng, 4) if v > 1 else "", 0))
    db.executemany("INSERT INTO wiki VALUES (?,?,?,?,?,?,?)", rows)


def _insert_filler_attachments(db: sqlite3.Connection, env_dir: str, rng: random.Random, scale: Scale) -> None:
    if not scale.filler_attachments:
        return
    lo, hi = scale.filler_attachment_bytes
    # One pool of pseudo-random bytes that the files are slices of: incompressible content
    # without generating every byte of every file.
    pool = rng.randbytes(2 * hi)
    rows = []
    for i in range(scale.filler_attachments):
        realm, parent = "ticket", str(NAMED_TICKET_COUNT + 1 + rng.randrange(scale.filler_tickets))
        filename = f"capture-{i + 1:04d}.bin"
        size = rng.randint(lo, hi)
        offset = rng.randrange(len(pool) - size)
        _write_attachment(env_dir, realm, parent, filename, pool[offset : offset + size])
        rows.append((realm, parent, filename, size, EPOCH_US + 60 * DAY_US + i * HOUR_US, "", rng.choice(USERS)))
    db.executemany("INSERT INTO attachment VALUES (?,?,?,?,?,?,?)", rows)


def database_path(env_dir: str) -> str:
    return os.path.join(env_dir, "db", "trac.db")


def content_digest(env_dir: str) -> str:
    """sha256 over every non-ephemeral table's rows (sorted by all columns) and every attachment
    file (path relative to the environment, bytes): equal for two builds of the same scale."""
    h = hashlib.sha256()
    db = sqlite3.connect(f"file:{database_path(env_dir)}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        for table in tables:
            if table in EPHEMERAL_TABLES:
                continue
            columns = [r[1] for r in db.execute(f'PRAGMA table_info("{table}")')]
            order = ", ".join(f'"{c}"' for c in columns)
            h.update(f"table {table} ({order})\n".encode())
            for row in db.execute(f'SELECT * FROM "{table}" ORDER BY {order}'):
                h.update(repr(row).encode())
                h.update(b"\n")
    finally:
        db.close()
    files_dir = os.path.join(env_dir, "files")
    for root, dirs, files in os.walk(files_dir):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            h.update(f"file {os.path.relpath(path, env_dir)}\n".encode())
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def _directory_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build a base state into a new directory")
    b.add_argument("--out", required=True)
    b.add_argument("--scale", required=True, choices=sorted(SCALES))
    d = sub.add_parser("digest", help="print the content digest of a built state")
    d.add_argument("env_dir")
    args = parser.parse_args(argv)
    if args.command == "build":
        started = time.monotonic()
        build(args.out, args.scale)
        db_mb = os.path.getsize(database_path(args.out)) / 1e6
        total_mb = _directory_bytes(args.out) / 1e6
        print(
            f"built {args.scale} state in {args.out}: db {db_mb:.1f} MB, total {total_mb:.1f} MB,"
            f" {time.monotonic() - started:.1f} s, builder version {BUILDER_VERSION}"
        )
    else:
        print(content_digest(args.env_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
