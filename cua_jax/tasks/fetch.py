"""Fetching a task's files on the host: local paths, file:// URLs, loopback URLs and the
download mirror, and which addresses only the network could serve.

Environments have no network, so a setup step's download happens here and is uploaded;
an http(s) URL of another host is served only from the download mirror (a folder named
by `mirror` or $CUA_JAX_DOWNLOAD_MIRROR; `python -m experiments.tasks mirror` fills it,
cua_jax.tasks.mirror), else it raises NetworkNeeded.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import urllib.parse
import urllib.request

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
DOWNLOAD_MIRROR_ENV = "CUA_JAX_DOWNLOAD_MIRROR"


class NetworkNeeded(PermissionError):
    """A URL only the network can serve: not local, not loopback, not in the download mirror."""

    def __init__(self, url: str):
        super().__init__(f"needs network: {url}")
        self.url = url


def download_mirror(mirror: str | pathlib.Path | None = None) -> pathlib.Path | None:
    """The download mirror folder: `mirror`, else $CUA_JAX_DOWNLOAD_MIRROR, else none."""
    chosen = mirror if mirror is not None else os.environ.get(DOWNLOAD_MIRROR_ENV)
    return pathlib.Path(chosen).expanduser() if chosen else None


@contextlib.contextmanager
def downloads_from(mirror: str | pathlib.Path | None):
    """Within the block, every download that names no mirror reads `mirror` (through
    $CUA_JAX_DOWNLOAD_MIRROR, so setups deep in a pool see it); the variable's value before
    the block comes back after it. None changes nothing."""
    if mirror is None:
        yield
        return
    before = os.environ.get(DOWNLOAD_MIRROR_ENV)
    os.environ[DOWNLOAD_MIRROR_ENV] = os.path.abspath(os.path.expanduser(mirror))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DOWNLOAD_MIRROR_ENV, None)
        else:
            os.environ[DOWNLOAD_MIRROR_ENV] = before


def mirror_path(url: str, mirror: str | pathlib.Path) -> pathlib.Path:
    """Where a download mirror keeps `url`: <mirror>/<host[:port]>/<path, unquoted>, with
    "?<query>" appended to the file name when the URL has a query. OSWorld's files
    (https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/...)
    mirror as <mirror>/huggingface.co/datasets/xlangai/...."""
    parsed = urllib.parse.urlsplit(url)
    parts = [p for p in urllib.parse.unquote(parsed.path).split("/") if p not in ("", ".", "..")]
    if parsed.query:
        parts = parts or ["index"]
        parts[-1] += "?" + parsed.query
    return pathlib.Path(mirror).expanduser() / parsed.netloc.lower() / pathlib.Path(*parts or ["index"])


def is_remote(url: str) -> bool:
    """True for an http(s) URL of another host: only the network or the mirror serves it."""
    parsed = urllib.parse.urlsplit(url)
    return parsed.scheme in ("http", "https") and parsed.hostname not in LOOPBACK_HOSTS


def needs_network(url: str, mirror: str | pathlib.Path | None = None) -> bool:
    """True for an http(s) URL of another host that the download mirror does not hold."""
    if not is_remote(url):
        return False
    folder = download_mirror(mirror)
    return folder is None or not mirror_path(url, folder).is_file()


def resolve_local(path: str, base_dir: str) -> pathlib.Path:
    """A task file's local path: `path` itself when absolute (after ~), else under `base_dir`."""
    candidate = pathlib.Path(path).expanduser()
    return candidate if candidate.is_absolute() else pathlib.Path(base_dir) / candidate


def fetch(url: str, base_dir: str, timeout: float = 30.0, mirror: str | pathlib.Path | None = None) -> bytes:
    """The bytes behind a local path, a file:// URL, a loopback http(s) URL, or an http(s)
    URL the download mirror holds (`mirror`, default $CUA_JAX_DOWNLOAD_MIRROR).

    Environments have no network, so downloads happen here and are uploaded; any other
    URL raises NetworkNeeded ("needs network: <url>").
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme in ("", "file"):
        path = resolve_local(urllib.parse.unquote(parsed.path) if parsed.scheme else url, base_dir)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        return path.read_bytes()
    if parsed.scheme in ("http", "https"):
        if parsed.hostname in LOOPBACK_HOSTS:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return response.read()
        folder = download_mirror(mirror)
        if folder is not None and mirror_path(url, folder).is_file():
            return mirror_path(url, folder).read_bytes()
        raise NetworkNeeded(url)
    raise ValueError(f"unsupported URL scheme '{parsed.scheme}' in {url}")
