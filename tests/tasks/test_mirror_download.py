"""`python -m experiments.tasks mirror`: the cloud files of a task folder downloaded into the
download mirror, against a loopback server standing in for the hosts (--base_url)."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import pathlib
import threading

import pytest

from cua_jax.tasks import fetch, mirror, runnable, schema
from experiments import tasks as tasks_cli

HF = "https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main"
DRIVE_PAGE = """<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head><body>
<p>Google Drive can't scan this file for viruses.</p>
<form id="download-form" action="https://drive.usercontent.google.com/download" method="get">
<input type="submit" id="uc-download-link" value="Download anyway"/>
<input type="hidden" name="id" value="ABC"><input type="hidden" name="export" value="download">
<input type="hidden" name="confirm" value="t"><input type="hidden" name="uuid" value="u-1"></form></body></html>"""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FileServer(http.server.ThreadingHTTPServer):
    """Serves `routes` (request path with query -> what to answer) and keeps every request's
    path and headers. A route: {"body": bytes, "headers": {...}, "ranges": bool (default
    true), "cut": n (the first n answers stop after half the body)} or {"location": URL}
    or {"page": html}."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, dict] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.requests.append((self.path, dict(self.headers)))
        route = self.server.routes.get(self.path)
        if route is None:
            self.send_error(404)
        elif "location" in route:
            self.send_response(302)
            self.send_header("Location", route["location"])
            for name, value in route.get("headers", {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif "page" in route:
            self._send(200, route["page"].encode(), {"Content-Type": "text/html; charset=utf-8"})
        else:
            self._send_file(route)

    def _send(self, status: int, body: bytes, headers: dict[str, str], cut: bool = False):
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if cut else body)

    def _send_file(self, route: dict):
        body, headers = route["body"], {"Content-Type": "application/octet-stream", **route.get("headers", {})}
        wanted = self.headers.get("Range")
        cut = route.get("cut", 0) > 0
        route["cut"] = route.get("cut", 0) - 1
        if wanted and route.get("ranges", True):
            start = int(wanted.removeprefix("bytes=").rstrip("-"))
            headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
            self._send(206, body[start:], headers, cut)
        else:
            self._send(200, body, headers, cut)


@contextlib.contextmanager
def serving():
    """A FileServer answering on its own thread for the block."""
    files = FileServer()
    thread = threading.Thread(target=files.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield files
    finally:
        files.shutdown()
        files.server_close()


@pytest.fixture
def server():
    with serving() as files:
        yield files


@pytest.fixture(autouse=True)
def no_retry_pause(monkeypatch):
    monkeypatch.setattr(mirror, "RETRY_PAUSE_S", 0.0)


def serve(server: FileServer, url: str, route: dict) -> None:
    """Serves `url` where --base_url sends it: /HOST/PATH?Q."""
    server.routes[mirror.request_url(url, "http://base").removeprefix("http://base")] = route


def write_task(folder, name: str, downloads=(), cloud: str | None = None, config=()) -> None:
    """An OSWorld-style task file: a download step of `downloads`, a cloud_file getter of `cloud`."""
    steps = list(config)
    if downloads:
        files = [{"url": url, "path": f"/home/user/file{i}"} for i, url in enumerate(downloads)]
        steps.insert(0, {"type": "download", "parameters": {"files": files}})
    evaluator = {
        "func": "compare_text_file",
        "result": {"type": "vm_file", "path": "/home/user/file0", "dest": "result.txt"},
        "expected": {"type": "cloud_file", "path": cloud, "dest": "expected.txt"}
        if cloud
        else {"type": "local_file", "path": "expected.txt"},
    }
    value = {"id": name, "instruction": "x", "config": steps, "evaluator": evaluator}
    (folder / f"{name}.json").parent.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(value))
    (folder / "expected.txt").write_text("expected")


def run(tasks, out, server, *extra) -> int:
    argv = ["mirror", "--tasks", str(tasks), "--out", str(out), "--base_url", server.url, "--retries", "0"]
    return tasks_cli.main([*argv, *extra])


def manifest(out) -> dict:
    return json.loads((out / mirror.MANIFEST).read_text())


def test_download_urls_are_download_steps_and_cloud_files_only(tmp_path):
    web, cloud, local = f"{HF}/a.csv", f"{HF}/expected.txt", "http://127.0.0.1:9/local.txt"
    write_task(
        tmp_path,
        "t",
        downloads=[web, local, "file.txt", web],
        cloud=cloud,
        config=[
            {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://www.example.org"]}},
            {"type": "execute", "parameters": {"command": "curl -O https://example.com/x.zip", "shell": True}},
        ],
    )
    assert runnable.download_urls(schema.load_task(tmp_path / "t.json")) == [web, cloud]


def test_mirror_then_check_counts_the_tasks_runnable(tmp_path, server, capsys):
    download, expected = f"{HF}/os/data.csv", f"{HF}/os/expected.txt"
    table = b"a,b\n1,2\n"
    serve(server, download, {"body": table, "headers": {"X-Linked-Etag": f'"{sha256(table)}"'}})
    serve(server, expected, {"body": b"expected\n"})
    tasks, out = tmp_path / "examples", tmp_path / "mirror"
    write_task(tasks / "os", "download", downloads=[download])
    write_task(tasks / "os", "cloud", downloads=[download], cloud=expected)
    assert {row["status"] for row in tasks_cli.classify(tasks, set(), mirror=str(out))} == {"not runnable"}

    assert run(tasks, out, server) == 0
    printed = capsys.readouterr().out
    assert sum(line.startswith("fetched ") for line in printed.splitlines()) == 2 and "2 fetched (17 bytes)" in printed
    assert fetch.fetch(download, "/", mirror=out) == table and not fetch.needs_network(download, out)
    assert fetch.fetch(expected, "/", mirror=out) == b"expected\n"
    assert {row["status"] for row in tasks_cli.classify(tasks, set(), mirror=str(out))} == {"runnable"}
    record = manifest(out)["files"][download]
    assert record["path"] == "huggingface.co/" + download.split("huggingface.co/", 1)[1]
    assert (record["bytes"], record["sha256"]) == (8, sha256(table))
    assert record["tasks"] == ["os/cloud.json", "os/download.json"] and record["fetched"]
    assert manifest(out)["failures"] == {}

    # a rerun finds both intact and asks the server nothing
    asked = len(server.requests)
    assert run(tasks, out, server) == 0
    assert len(server.requests) == asked and "2 already mirrored" in capsys.readouterr().out


def test_a_redirect_mirrors_at_the_task_urls_path_and_checks_the_redirects_sha256(tmp_path, server):
    moved, wrong = f"{HF}/moved.txt", f"{HF}/wrong.txt"
    body = b"the file behind a redirect"
    serve(server, "https://cdn.example/blob", {"body": body})
    serve(server, moved, {"location": f"{server.url}/cdn.example/blob", "headers": {"X-Linked-Etag": sha256(body)}})
    serve(server, wrong, {"location": "/cdn.example/blob", "headers": {"X-Linked-Etag": sha256(b"other")}})
    looping = f"{HF}/looping.txt"
    serve(server, looping, {"location": f"{server.url}/{looping.removeprefix('https://')}"})
    write_task(tmp_path / "tasks", "t", downloads=[moved, wrong, looping])
    out = tmp_path / "mirror"
    assert run(tmp_path / "tasks", out, server) == 1
    assert manifest(out)["failures"][looping]["reason"] == "too many redirects"
    assert fetch.mirror_path(moved, out).read_bytes() == body
    assert not (out / "cdn.example").exists()
    assert not fetch.mirror_path(wrong, out).exists()
    assert manifest(out)["failures"][wrong]["reason"] == "checksum mismatch"


def test_a_missing_file_is_a_recorded_failure_and_the_others_are_fetched(tmp_path, server, capsys):
    present, missing = f"{HF}/present.txt", f"{HF}/missing.txt"
    serve(server, present, {"body": b"here"})
    write_task(tmp_path / "tasks" / "calc", "a", downloads=[missing, present])
    write_task(tmp_path / "tasks" / "os", "b", cloud=missing, downloads=[present])
    out = tmp_path / "mirror"
    assert run(tmp_path / "tasks", out, server, "--workers", "2") == 1
    printed = capsys.readouterr().out
    assert "failures by reason: HTTP 404 1" in printed and f"failed   {'HTTP 404':>16}" in printed
    failure = manifest(out)["failures"][missing]
    assert failure["reason"] == "HTTP 404" and failure["tasks"] == ["calc/a.json", "os/b.json"]
    assert fetch.mirror_path(present, out).read_bytes() == b"here"
    assert list(manifest(out)["files"]) == [present]


def test_an_interrupted_transfer_resumes_with_a_range_request(tmp_path, server):
    url = f"{HF}/big.bin"
    body = bytes(range(256)) * 40
    serve(server, url, {"body": body, "cut": 1, "headers": {"X-Linked-Etag": f'"{sha256(body)}"'}})
    write_task(tmp_path / "tasks", "t", downloads=[url])
    out = tmp_path / "mirror"
    part = fetch.mirror_path(url, out).with_name("big.bin" + mirror.PART_SUFFIX)

    assert run(tmp_path / "tasks", out, server) == 1  # no retries: the half stays in the .part
    assert manifest(out)["failures"][url]["reason"] == "incomplete transfer"
    assert part.read_bytes() == body[: len(body) // 2] and not fetch.mirror_path(url, out).exists()

    assert run(tmp_path / "tasks", out, server) == 0
    assert server.requests[-1][1].get("Range") == f"bytes={len(body) // 2}-"
    assert fetch.mirror_path(url, out).read_bytes() == body and not part.exists()
    assert manifest(out)["files"][url]["sha256"] == sha256(body) and manifest(out)["failures"] == {}


def test_a_retry_resumes_in_the_same_run_and_a_200_starts_again(tmp_path, server):
    resumed, restarted = f"{HF}/resumed.bin", f"{HF}/restarted.bin"
    body = b"0123456789" * 100
    serve(server, resumed, {"body": body, "cut": 1})
    serve(server, restarted, {"body": body, "ranges": False})
    out = tmp_path / "mirror"
    stale = fetch.mirror_path(restarted, out).with_name("restarted.bin" + mirror.PART_SUFFIX)
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale bytes of an older file")
    outcomes = mirror.mirror_urls({resumed: ["t.json"], restarted: ["t.json"]}, out, server.url, 1, 5.0, 1, print)
    assert [o.status for o in outcomes] == ["fetched", "fetched"]
    assert outcomes[0].note == f"resumed at {len(body) // 2} bytes" and outcomes[1].note.startswith("restarted")
    assert fetch.mirror_path(resumed, out).read_bytes() == body == fetch.mirror_path(restarted, out).read_bytes()


def test_a_wrong_checksum_rejects_the_file(tmp_path, server, capsys):
    url = f"{HF}/tampered.txt"
    serve(server, url, {"body": b"tampered", "headers": {"ETag": f'"{sha256(b"original")}"'}})
    write_task(tmp_path / "tasks", "t", downloads=[url])
    out = tmp_path / "mirror"
    assert run(tmp_path / "tasks", out, server) == 1
    target = fetch.mirror_path(url, out)
    assert not target.exists() and not target.with_name(target.name + mirror.PART_SUFFIX).exists()
    failure = manifest(out)["failures"][url]
    assert failure["reason"] == "checksum mismatch" and sha256(b"original") in failure["detail"]
    assert "failures by reason: checksum mismatch 1" in capsys.readouterr().out


def test_drive_confirmation_page_is_followed_once_and_other_pages_fail(tmp_path, server):
    large, private = "https://drive.google.com/uc?id=ABC&export=download", "https://drive.google.com/uc?id=XYZ"
    serve(server, large, {"page": DRIVE_PAGE})
    confirmed = "https://drive.usercontent.google.com/download?id=ABC&export=download&confirm=t&uuid=u-1"
    serve(server, confirmed, {"body": b"large drive file"})
    serve(server, private, {"page": "<html><body>Sign in</body></html>"})
    write_task(tmp_path / "tasks", "t", downloads=[large, private])
    out = tmp_path / "mirror"
    assert run(tmp_path / "tasks", out, server) == 1
    assert fetch.fetch(large, "/", mirror=out) == b"large drive file"
    assert fetch.mirror_path(large, out) == out / "drive.google.com" / "uc?id=ABC&export=download"
    failure = manifest(out)["failures"][private]
    assert failure["reason"] == "not a public file" and failure["detail"] == mirror.DRIVE_PAGE
    assert fetch.needs_network(private, out)


def test_a_corrupted_mirrored_file_is_fetched_again(tmp_path, server, capsys):
    url = f"{HF}/kept.txt"
    serve(server, url, {"body": b"the right bytes"})
    write_task(tmp_path / "tasks", "t", downloads=[url])
    out = tmp_path / "mirror"
    assert run(tmp_path / "tasks", out, server) == 0
    fetch.mirror_path(url, out).write_bytes(b"the wrong bytes")
    capsys.readouterr()
    assert run(tmp_path / "tasks", out, server) == 0
    assert "no longer matched its recorded sha256" in capsys.readouterr().out
    assert fetch.mirror_path(url, out).read_bytes() == b"the right bytes"


def test_private_and_link_local_addresses_are_refused(tmp_path, server):
    assert mirror.address_problem("10.1.2.3") == "a private-range or reserved address"
    assert mirror.address_problem("169.254.169.254", trusted=True) == "a link-local address"
    assert mirror.address_problem("127.0.0.1").startswith("a loopback address")
    assert mirror.address_problem("127.0.0.1", trusted=True) is None and mirror.address_problem("8.8.8.8") is None
    bounced = f"{HF}/bounced.txt"
    serve(server, bounced, {"location": "http://10.1.2.3/secret"})
    out = tmp_path / "mirror"
    outcomes = mirror.mirror_urls({bounced: ["t.json"]}, out, server.url, report=print)
    outcomes += mirror.mirror_urls({"http://169.254.169.254/latest/meta-data": ["t.json"]}, out, report=print)
    assert [(o.status, o.reason) for o in outcomes] == [("failed", "refused address")] * 2
    assert "10.1.2.3" in outcomes[0].detail and "link-local" in outcomes[1].detail


def test_bad_arguments_are_named(tmp_path, capsys):
    assert tasks_cli.main(["mirror", "--tasks", str(tmp_path / "absent"), "--out", str(tmp_path / "m")]) == 2
    assert "absent" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert tasks_cli.main(["mirror", "--tasks", str(tmp_path / "empty"), "--out", str(tmp_path / "m")]) == 2
    assert "holds no task files" in capsys.readouterr().err
    write_task(tmp_path / "tasks", "t", downloads=["file.txt"])
    assert tasks_cli.main(["mirror", "--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "m")]) == 0
    assert "download no cloud files" in capsys.readouterr().out
    argv = ["mirror", "--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "m")]
    assert tasks_cli.main([*argv, "--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err
    assert tasks_cli.main([*argv, "--base_url", "ftp://mirror"]) == 2
    assert "--base_url must be an http(s) URL" in capsys.readouterr().err


def test_downloads_from_a_mirror_only_within_the_block(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.DOWNLOAD_MIRROR_ENV, "/before")
    with fetch.downloads_from(tmp_path / "mirror"):
        assert fetch.download_mirror() == tmp_path / "mirror"
    assert fetch.download_mirror() == pathlib.Path("/before")
    monkeypatch.delenv(fetch.DOWNLOAD_MIRROR_ENV)
    with fetch.downloads_from(None):
        assert fetch.download_mirror() is None
    with pytest.raises(RuntimeError), fetch.downloads_from(tmp_path):
        raise RuntimeError("a failed run")
    assert fetch.download_mirror() is None
