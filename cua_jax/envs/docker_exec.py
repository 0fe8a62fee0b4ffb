"""Run a command in a container by `docker exec` and read all of its output.

docker-py's `exec_start` reads the exec's output from the raw socket beneath http.client's
buffered reader (`response.raw._fp.fp.raw`). When the daemon's first output frames arrive in
the same read as the response's headers, they sit in that reader's buffer and are skipped: a
short-lived command returns exit 0 with no output at all. Measured on docker 20.10 with
docker-py 7.2, `sh -c 'echo ...'` lost its output in 23, 29 and 123 of 1,500 execs on a loaded
machine (this reader: 0 of 1,500 between them), and a judge's verdict was lost the same way.
`exec_run` starts the exec without asking for a protocol upgrade, so the daemon answers 200 and
streams the multiplexed frames as a body that ends when the command's streams close, and reads
that body through the buffered response.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import docker.errors
import requests.exceptions

FRAME_HEADER = struct.Struct(">BxxxL")  # stream (1 stdout, 2 stderr), then the payload's length
STDOUT, STDERR = 1, 2


@dataclasses.dataclass(frozen=True)
class ExecResult:
    returncode: int | None
    stdout: bytes
    stderr: bytes


def demultiplex(data: bytes) -> tuple[bytes, bytes]:
    """(stdout, stderr) of the daemon's multiplexed stream (a non-TTY exec's output): frames of
    an 8-byte header, the stream and the length, then that many bytes. A cut-off last frame
    keeps what arrived."""
    streams: dict[int, list[bytes]] = {STDOUT: [], STDERR: []}
    offset = 0
    while offset + FRAME_HEADER.size <= len(data):
        stream, length = FRAME_HEADER.unpack_from(data, offset)
        offset += FRAME_HEADER.size
        streams.setdefault(stream, []).append(data[offset : offset + length])
        offset += length
    return b"".join(streams[STDOUT]), b"".join(streams[STDERR])


def exec_run(
    api: Any,
    container_id: str,
    argv: Sequence[str],
    *,
    environment: Mapping[str, str] | None = None,
    user: str = "",
    timeout: float | None = None,
) -> ExecResult:
    """Run `argv` in the container and wait for it; its exit status and all of its output.

    api: a docker SDK `APIClient` (`docker.from_env().api`); timeout: seconds the read may wait
    for the next bytes (None: as long as the command runs). Raises the SDK's and requests'
    errors as `exec_start` does (an HTTP error status as the SDK's APIError)."""
    exec_id = api.exec_create(container_id, list(argv), environment=dict(environment or {}), user=user)["Id"]
    response = api.post(
        f"{api.base_url}/v{api.api_version}/exec/{exec_id}/start",
        json={"Detach": False, "Tty": False},
        stream=True,
        timeout=(api.timeout, timeout),
    )
    try:
        try:
            response.raise_for_status()
        except requests.exceptions.HTTPError as error:
            # as the SDK's own calls raise it: NotFound for a container that is gone, and so on
            docker.errors.create_api_error_from_http_exception(error)
        data = response.raw.read()
    finally:
        response.close()
    stdout, stderr = demultiplex(data)
    return ExecResult(api.exec_inspect(exec_id)["ExitCode"], stdout, stderr)
