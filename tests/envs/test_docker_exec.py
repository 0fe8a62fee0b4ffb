"""`docker_exec.exec_run`: every byte of an exec's output, whichever read brings it.

The first test serves the exact bytes that lose a short command's output in docker-py's own
`exec_start` (its frames in the same packet as the response's headers: the SDK reads past the
buffer holding them and returns no output) from a stand-in daemon on a Unix socket; the others
run against the real daemon."""

from __future__ import annotations

import json
import os
import socket
import threading

import docker
import docker.errors
import pytest

from cua_jax.envs.docker_exec import FRAME_HEADER, STDERR, STDOUT, demultiplex, exec_run
from cua_jax.envs.images import BASE, ensure_image


def _frame(stream: int, payload: bytes) -> bytes:
    return FRAME_HEADER.pack(stream, len(payload)) + payload


def _serve(listener: socket.socket, answers: dict[str, bytes]) -> None:
    """Answer one request per connection, by its request line's path, in a single send."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(body) < length:
                body += connection.recv(65536)
            path = head.split(b" ")[1].decode()
            connection.sendall(next(reply for suffix, reply in answers.items() if path.endswith(suffix)))


def _json_reply(value) -> bytes:
    body = json.dumps(value).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def test_output_that_arrives_with_the_response_headers_is_read(tmp_path):
    path = os.path.join(tmp_path, "docker.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()
    frames = _frame(STDOUT, b"verdict 1.0\n") + _frame(STDERR, b"a warning\n") + _frame(STDOUT, b"done\n")
    answers = {
        "/containers/c1/exec": _json_reply({"Id": "e1"}),
        "/exec/e1/start": b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n" + frames,
        "/exec/e1/json": _json_reply({"ExitCode": 0, "Running": False}),
    }
    server = threading.Thread(target=_serve, args=(listener, answers), daemon=True)
    server.start()
    api = docker.APIClient(base_url=f"unix://{path}", version="1.41", timeout=10)
    try:
        result = exec_run(api, "c1", ["python3", "-c", "pass"])
    finally:
        api.close()
        listener.close()
    assert (result.returncode, result.stdout, result.stderr) == (0, b"verdict 1.0\ndone\n", b"a warning\n")


def test_demultiplex_keeps_each_stream_in_order_and_a_cut_off_frame():
    data = _frame(STDOUT, b"ab") + _frame(STDERR, b"") + _frame(STDERR, b"x") + _frame(STDOUT, b"cd")
    assert demultiplex(data) == (b"abcd", b"x")
    assert demultiplex(data + FRAME_HEADER.pack(STDOUT, 10) + b"xyz") == (b"abcdxyz", b"x")
    assert demultiplex(b"") == (b"", b"")


@pytest.fixture(scope="module")
def container():
    client = docker.from_env(timeout=60)
    running = client.containers.run(ensure_image(BASE), ["sleep", "600"], detach=True, network_mode="none")
    try:
        yield client, running.id
    finally:
        running.remove(force=True)
        client.close()


def test_short_commands_on_the_real_daemon_return_all_output_and_their_status(container):
    client, container_id = container
    for index in range(50):
        result = exec_run(client.api, container_id, ["/bin/sh", "-c", f"echo out{index}; echo err >&2; exit 3"])
        assert (result.returncode, result.stdout, result.stderr) == (3, f"out{index}\n".encode(), b"err\n")


def test_long_output_user_and_environment_on_the_real_daemon(container):
    client, container_id = container
    big = exec_run(client.api, container_id, ["/bin/sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x"])
    assert (big.returncode, big.stdout, big.stderr) == (0, b"x" * 300000, b"")
    who = exec_run(
        client.api,
        container_id,
        ["/bin/sh", "-c", 'echo "$(id -u) $GREETING"'],
        environment={"GREETING": "hi"},
        user="nobody",
    )
    assert who.stdout.split() == [b"65534", b"hi"]


def test_a_missing_container_raises_the_sdks_not_found():
    client = docker.from_env(timeout=60)
    try:
        with pytest.raises(docker.errors.NotFound):
            exec_run(client.api, "cua-jax-no-such-container", ["true"])
    finally:
        client.close()
