"""Filling a download mirror (cua_jax.tasks.fetch) with the cloud files tasks download.

    mirror_urls({url: [task file, ...]}, mirror, base_url=None, workers=4, timeout=60, retries=2)
        -> [Outcome]: per URL "fetched", "skipped" (already mirrored and intact) or "failed"

Each URL lands at fetch.mirror_path(url, mirror), the path fetch looks up, whatever redirects
the server made. A transfer is written to <file>.part and renamed when complete; a .part left
by an interrupted transfer resumes with an HTTP Range request (a 206 appends, a 200 starts
again). Hugging Face answers with the file's sha256 (X-Linked-Etag, or an ETag of 64 hex
digits): bytes that do not match it are rejected. A public Google Drive file over Drive's
virus-scan limit answers with a confirmation page whose form (id="download-form") is followed
once; any other page where a file was expected is a failure, not a mirrored file.

<mirror>/manifest.json records, per URL, the file (relative path, bytes, sha256, when
fetched) or why it could not be fetched, with the task files naming it. A mirrored file whose
bytes no longer match its recorded sha256 is reported and fetched again.

base_url: every https://HOST/PATH?Q is asked of {base_url}/HOST/PATH?Q instead (a mirror
server of one's own, or a test server). Connections go only to public addresses: private,
loopback and link-local ones are refused, checked on the address actually connected to (each
redirect too); the base URL's own host may be loopback or private, as its user named it.
Proxies from the environment are not used.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import functools
import hashlib
import html.parser
import http.client
import ipaddress
import json
import os
import pathlib
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from cua_jax.tasks import fetch

MANIFEST = "manifest.json"
PART_SUFFIX = ".part"
MAX_REDIRECTS = 5
RETRY_PAUSE_S = 0.5  # times the attempt number, between attempts
DRIVE_HOSTS = frozenset({"drive.google.com", "drive.usercontent.google.com", "docs.google.com"})
DRIVE_PAGE = "Drive returned a page, not the file: not public or quota exceeded"
USER_AGENT = "cua_jax-mirror/1"
_CHUNK = 1 << 16
_PAGE_LIMIT = 1 << 20  # bytes of a Drive page read to find its form
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class DownloadFailed(Exception):
    """A URL not fetched. `reason` groups failures in the summary ("HTTP 404", "timeout",
    "checksum mismatch", ...); the message says the rest. `retry`: worth another attempt."""

    def __init__(self, reason: str, detail: str, retry: bool = False):
        super().__init__(detail)
        self.reason, self.retry = reason, retry


class RefusedAddress(OSError):
    """A connection to a private, loopback or link-local address."""


@dataclasses.dataclass
class Outcome:
    url: str
    status: str  # "fetched", "skipped" or "failed"
    path: str  # in the mirror, relative to it
    bytes: int = 0
    seconds: float = 0.0
    sha256: str = ""
    reason: str = ""  # of a failure
    detail: str = ""  # of a failure
    note: str = ""  # e.g. "resumed at 1024 bytes"


def request_url(url: str, base_url: str | None) -> str:
    """The address asked for `url`: `url` itself, or {base_url}/HOST/PATH?QUERY."""
    if not base_url:
        return url
    parsed = urllib.parse.urlsplit(url)
    query = f"?{parsed.query}" if parsed.query else ""
    return f"{base_url.rstrip('/')}/{parsed.netloc}{parsed.path or '/'}{query}"


def _logical_url(url: str, base_url: str | None) -> str:
    """The URL a base-URL address stands for (request_url's inverse, as https)."""
    prefix = base_url.rstrip("/") + "/" if base_url else None
    return "https://" + url[len(prefix) :] if prefix and url.startswith(prefix) else url


# ------------------------------------------------------------------------------------
# Connections only to public addresses
# ------------------------------------------------------------------------------------


def address_problem(address: str, trusted: bool = False) -> str | None:
    """Why an IP address may not be downloaded from, or None. trusted: the --base_url host,
    which may be loopback or private (never link-local: cloud metadata services live there)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope
    ip = getattr(ip, "ipv4_mapped", None) or ip
    if ip.is_link_local:
        return "a link-local address"
    if trusted or ip.is_global:
        return None
    if ip.is_loopback:
        return "a loopback address (allowed only as --base_url)"
    return "a private-range or reserved address"


def _checked_create_connection(trusted_host: str | None) -> Callable[..., socket.socket]:
    """socket.create_connection that refuses non-public addresses (after resolving, so a
    name that resolves to one is refused too)."""

    def create_connection(address, timeout=None, source_address=None) -> socket.socket:
        host, port = address
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        for *_, sockaddr in infos:
            problem = address_problem(sockaddr[0], trusted=host.lower() == trusted_host)
            if problem:
                raise RefusedAddress(f"{host} is {sockaddr[0]}, {problem}")
        error: OSError = OSError(f"{host}: no address")
        for family, kind, proto, _, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)
                return sock
            except OSError as failed:
                sock.close()
                error = failed
        raise error

    return create_connection


class _CheckedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args, trusted_host: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = _checked_create_connection(trusted_host)


class _CheckedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args, trusted_host: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = _checked_create_connection(trusted_host)


class _CheckedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, trusted_host: str | None):
        super().__init__()
        self.trusted_host = trusted_host

    def http_open(self, req):
        return self.do_open(functools.partial(_CheckedHTTPConnection, trusted_host=self.trusted_host), req)


class _CheckedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, trusted_host: str | None):
        super().__init__()
        self.trusted_host = trusted_host

    def https_open(self, req):
        connection = functools.partial(_CheckedHTTPSConnection, trusted_host=self.trusted_host)
        return self.do_open(connection, req, context=self._context)


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follows at most MAX_REDIRECTS redirects, to http(s) only, keeping the sha256 that
    Hugging Face puts on its redirect (X-Linked-Etag) rather than on the file's response."""

    max_redirections = MAX_REDIRECTS

    def __init__(self):
        super().__init__()
        self.linked_sha256: str | None = None

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            raise DownloadFailed("bad redirect", f"redirected to {newurl}")
        self.linked_sha256 = self.linked_sha256 or _sha256_header(headers, "X-Linked-Etag")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _sha256_header(headers, name: str) -> str | None:
    value = (headers.get(name) or "").strip().removeprefix("W/").strip('"').lower()
    return value if _SHA256.match(value) else None


# ------------------------------------------------------------------------------------
# Google Drive's confirmation page
# ------------------------------------------------------------------------------------


class _DriveForm(html.parser.HTMLParser):
    """The action and hidden inputs of a page's form id="download-form"."""

    def __init__(self):
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self._inside = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form" and attrs.get("id") == "download-form":
            self.action, self._inside = attrs.get("action") or "", True
        elif tag == "input" and self._inside and (attrs.get("type") or "").lower() == "hidden" and attrs.get("name"):
            self.fields[attrs["name"]] = attrs.get("value") or ""

    def handle_endtag(self, tag):
        if tag == "form":
            self._inside = False


def drive_form_url(page: str, page_url: str) -> str | None:
    """The URL Drive's confirmation form submits to (its action with its hidden inputs as
    the query), or None when the page has no such form."""
    form = _DriveForm()
    form.feed(page)
    if form.action is None:
        return None
    action = urllib.parse.urljoin(page_url, form.action)
    return action + ("&" if "?" in action else "?") + urllib.parse.urlencode(form.fields)


def _is_page(response) -> bool:
    """An HTML page, not a file sent as an attachment."""
    kind = response.headers.get_content_type()
    return kind == "text/html" and "attachment" not in (response.headers.get("Content-Disposition") or "")


# ------------------------------------------------------------------------------------
# One URL
# ------------------------------------------------------------------------------------


def sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Downloader:
    """Fetches URLs into a mirror folder; safe to share between threads."""

    def __init__(self, mirror: pathlib.Path, base_url: str | None, timeout: float, retries: int):
        self.mirror, self.base_url, self.timeout, self.retries = mirror, base_url, timeout, retries
        self.trusted_host = urllib.parse.urlsplit(base_url).hostname if base_url else None

    def _open(self, address: str, offset: int) -> tuple[http.client.HTTPResponse, str | None]:
        """The response to GET `address` (from byte `offset`) and the sha256 the server
        gives for the file, if any."""
        redirects = _RedirectHandler()
        opener = urllib.request.OpenerDirector()
        for handler in (
            _CheckedHTTPHandler(self.trusted_host),
            _CheckedHTTPSHandler(self.trusted_host),
            redirects,
            urllib.request.HTTPDefaultErrorHandler(),
            urllib.request.HTTPErrorProcessor(),
            urllib.request.UnknownHandler(),
        ):
            opener.add_handler(handler)
        headers = {"User-Agent": USER_AGENT, **({"Range": f"bytes={offset}-"} if offset else {})}
        try:
            response = opener.open(urllib.request.Request(address, headers=headers), timeout=self.timeout)
        except urllib.error.HTTPError as error:
            error.close()
            if 300 <= error.code < 400 and str(error.reason).startswith(_RedirectHandler.inf_msg):
                raise DownloadFailed("too many redirects", f"more than {MAX_REDIRECTS} redirects or a loop") from None
            retry = error.code in (408, 429) or error.code >= 500
            raise DownloadFailed(f"HTTP {error.code}", f"HTTP {error.code} {error.reason}", retry) from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, RefusedAddress):
                raise DownloadFailed("refused address", str(error.reason)) from None
            if isinstance(error.reason, TimeoutError):
                raise DownloadFailed("timeout", f"no answer in {self.timeout:g} s", retry=True) from None
            raise DownloadFailed("connection error", str(error.reason), retry=True) from None
        except TimeoutError:
            raise DownloadFailed("timeout", f"no answer in {self.timeout:g} s", retry=True) from None
        except (OSError, http.client.HTTPException) as error:
            raise DownloadFailed("connection error", f"{type(error).__name__}: {error}", retry=True) from None
        expected = redirects.linked_sha256 or _sha256_header(response.headers, "X-Linked-Etag")
        return response, expected or _sha256_header(response.headers, "ETag")

    def _open_file(self, url: str, offset: int) -> tuple[http.client.HTTPResponse, str | None]:
        """_open for the file behind `url`, through Drive's confirmation page when it sends one."""
        response, expected = self._open(request_url(url, self.base_url), offset)
        if urllib.parse.urlsplit(url).hostname not in DRIVE_HOSTS or not _is_page(response):
            return response, expected
        with response:
            page = response.read(_PAGE_LIMIT).decode("utf-8", "replace")
            page_url = _logical_url(response.geturl(), self.base_url)
        form_url = drive_form_url(page, page_url)
        if form_url is None:
            raise DownloadFailed("not a public file", DRIVE_PAGE)
        response, expected = self._open(request_url(form_url, self.base_url), offset)
        if _is_page(response):
            response.close()
            raise DownloadFailed(
                "Drive confirmation failed", f"Drive answered its confirmation form with a page: {DRIVE_PAGE}"
            )
        return response, expected

    def _transfer(self, url: str, part: pathlib.Path) -> tuple[str, str]:
        """Completes `part` from the server, resuming what it holds; returns a note and the
        completed file's sha256 (read once, for the server's checksum and the manifest)."""
        offset = part.stat().st_size if part.is_file() else 0
        try:
            response, expected = self._open_file(url, offset)
        except DownloadFailed as failure:
            if offset and failure.reason == "HTTP 416":  # the .part is not a prefix of the file
                part.unlink()
                return self._transfer(url, part)
            raise
        with response:
            length = response.headers.get("Content-Length", "")
            if offset and response.status == 206:
                content_range = response.headers.get("Content-Range", "")
                if not content_range.startswith(f"bytes {offset}-"):
                    part.unlink()
                    raise DownloadFailed("bad resume", f"asked from byte {offset}, got {content_range!r}", retry=True)
                mode, note = "ab", f"resumed at {offset} bytes"
            else:
                mode, note, offset = "wb", "restarted: the server ignored the range" if offset else "", 0
            total = offset + int(length) if length.isdigit() else None
            received = 0
            with open(part, mode) as out:  # what arrives stays in the .part, for the next attempt
                while True:
                    try:
                        chunk = response.read(_CHUNK)
                    except TimeoutError:
                        raise DownloadFailed("timeout", f"stalled after {offset + received} bytes", True) from None
                    except (OSError, http.client.HTTPException) as error:
                        why = f"{type(error).__name__} after {offset + received} bytes"
                        raise DownloadFailed("incomplete transfer", why, retry=True) from None
                    if not chunk:
                        break
                    out.write(chunk)
                    received += len(chunk)
        if total is not None and offset + received < total:
            raise DownloadFailed("incomplete transfer", f"{offset + received} of {total} bytes", retry=True)
        got = sha256_of(part)
        if expected is not None and got != expected:
            part.unlink()
            raise DownloadFailed("checksum mismatch", f"sha256 {got}, the server says {expected}")
        return note, got

    def fetch_url(self, url: str, record: dict | None) -> Outcome:
        """Fetches `url` unless the mirror holds it intact (as `record`, its manifest entry, says)."""
        started = time.monotonic()
        target = fetch.mirror_path(url, self.mirror)
        relative = target.relative_to(self.mirror).as_posix()
        part = target.with_name(target.name + PART_SUFFIX)
        notes, digest = [], ""
        try:
            if target.is_file():
                if record and record.get("path") == relative:
                    size = target.stat().st_size
                    if size == record.get("bytes") and sha256_of(target) == record.get("sha256"):
                        return Outcome(url, "skipped", relative, size, time.monotonic() - started, record["sha256"])
                    target.unlink()  # never serve bytes known to be wrong
                    notes.append("the mirrored file no longer matched its recorded sha256")
                else:
                    notes.append("replaced a file without a record")
            target.parent.mkdir(parents=True, exist_ok=True)
            for attempt in range(self.retries + 1):
                try:
                    note, digest = self._transfer(url, part)
                    notes.append(note)
                    break
                except DownloadFailed as failure:
                    if not failure.retry or attempt == self.retries:
                        raise
                    time.sleep(RETRY_PAUSE_S * (attempt + 1))
            os.replace(part, target)
        except DownloadFailed as failure:
            seconds = time.monotonic() - started
            return Outcome(
                url, "failed", relative, 0, seconds, "", failure.reason, str(failure), "; ".join(filter(None, notes))
            )
        except OSError as error:  # the mirror folder itself: a file where a folder must go, a full disk
            seconds = time.monotonic() - started
            return Outcome(
                url, "failed", relative, 0, seconds, "", "local error", str(error), "; ".join(filter(None, notes))
            )
        size = target.stat().st_size
        return Outcome(
            url,
            "fetched",
            relative,
            size,
            time.monotonic() - started,
            digest,
            note="; ".join(filter(None, notes)),
        )


# ------------------------------------------------------------------------------------
# The manifest and a whole run
# ------------------------------------------------------------------------------------


class Manifest:
    """<mirror>/manifest.json: {"files": {url: {path, bytes, sha256, fetched, tasks}},
    "failures": {url: {reason, detail, tasks, time}}}; saved after every URL, so an
    interrupted run keeps what it fetched."""

    def __init__(self, mirror: pathlib.Path):
        self.path = mirror / MANIFEST
        data = {}
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text())
            except ValueError as error:
                raise ValueError(f"{self.path} is not valid JSON ({error}); remove it to start over") from None
        self.files: dict[str, dict] = data.get("files", {})
        self.failures: dict[str, dict] = data.get("failures", {})
        self._lock = threading.Lock()

    def record(self, outcome: Outcome, tasks: list[str]) -> None:
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        with self._lock:
            if outcome.status == "failed":
                self.files.pop(outcome.url, None)
                self.failures[outcome.url] = {
                    "reason": outcome.reason,
                    "detail": outcome.detail,
                    "tasks": tasks,
                    "time": now,
                }
            else:
                self.failures.pop(outcome.url, None)
                fetched = now if outcome.status == "fetched" else self.files[outcome.url]["fetched"]
                self.files[outcome.url] = {
                    "path": outcome.path,
                    "bytes": outcome.bytes,
                    "sha256": outcome.sha256,
                    "fetched": fetched,
                    "tasks": tasks,
                }
            written = self.path.with_name(self.path.name + ".tmp")
            written.write_text(json.dumps({"files": self.files, "failures": self.failures}, indent=1, sort_keys=True))
            os.replace(written, self.path)


def progress_line(outcome: Outcome) -> str:
    """One line per URL: what happened, bytes (or the failure's reason), seconds, the URL."""
    amount = outcome.reason if outcome.status == "failed" else f"{outcome.bytes:,} B"
    detail = f": {outcome.detail}" if outcome.detail else ""
    note = f" ({outcome.note})" if outcome.note else ""
    return f"{outcome.status:<8} {amount:>16} {outcome.seconds:7.1f} s  {outcome.url}{detail}{note}"


def mirror_urls(
    sources: dict[str, list[str]],
    mirror: str | pathlib.Path,
    base_url: str | None = None,
    workers: int = 4,
    timeout: float = 60.0,
    retries: int = 2,
    report: Callable[[str], None] = print,
) -> list[Outcome]:
    """Fetches every URL of `sources` (url -> the task files naming it) into `mirror`,
    reporting a progress line per URL; the outcomes in the order of `sources`."""
    mirror = pathlib.Path(mirror).expanduser()
    mirror.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(mirror)
    downloader = Downloader(mirror, base_url, timeout, retries)
    # URLs sharing a mirror path (http and https of one file) go to one worker, in turn
    by_path: dict[pathlib.Path, list[str]] = {}
    for url in sources:
        by_path.setdefault(fetch.mirror_path(url, mirror), []).append(url)
    report_lock = threading.Lock()
    outcomes: dict[str, Outcome] = {}

    def mirror_in_turn(urls: list[str]) -> None:
        for url in urls:
            outcome = downloader.fetch_url(url, manifest.files.get(url))
            manifest.record(outcome, sources[url])
            with report_lock:
                outcomes[url] = outcome
                report(progress_line(outcome))

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for done in [pool.submit(mirror_in_turn, urls) for urls in by_path.values()]:
            done.result()
    return [outcomes[url] for url in sources]
