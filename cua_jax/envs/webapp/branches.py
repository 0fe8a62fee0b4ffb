"""Branches of an application's state: a directory (database plus files) copied from a source
by copy-on-write where the filesystem offers it, else by a plain copy.

    method = branch_method(parent)            # "reflink" on XFS/btrfs (and others with FICLONE), else "copy"
    branch(source, destination, method)       # destination must not exist

"reflink": every file is cloned (`cp --reflink=always`): the new branch shares its blocks with
the source until either writes, so a branch of a 100 MB database costs milliseconds and no
space. "copy": a full copy (`cp`), the measured fallback where the filesystem cannot clone
(ext4, tmpfs, overlayfs). Both keep modes and times. The method is probed once per parent
directory by cloning a small file there, as a branch would be.
"""

from __future__ import annotations

import fcntl
import functools
import os
import pathlib
import shutil
import stat
import struct
import subprocess
import tempfile

BRANCH_METHODS = ("reflink", "copy")


@functools.cache
def branch_method(parent: str | os.PathLike) -> str:
    """ "reflink" when files under `parent` can be cloned, else "copy"."""
    parent = pathlib.Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".probe-") as probe:
        source = pathlib.Path(probe, "source")
        source.write_bytes(b"\0" * 65536)
        done = subprocess.run(
            ["cp", "--reflink=always", str(source), str(pathlib.Path(probe, "clone"))],
            capture_output=True,
        )
    return "reflink" if done.returncode == 0 else "copy"


def branch(source: str | os.PathLike, destination: str | os.PathLike, method: str) -> None:
    """Copy the directory `source` to `destination` (which must not exist) by `method`.
    A failed copy leaves no destination behind."""
    if method not in BRANCH_METHODS:
        raise ValueError(f"unknown branch method {method!r}; known: {BRANCH_METHODS}")
    destination = pathlib.Path(destination)
    if destination.exists():
        raise FileExistsError(f"branch {destination} exists already")
    command = ["cp", "-a", "--reflink=always" if method == "reflink" else "--reflink=never"]
    done = subprocess.run([*command, str(source), str(destination)], capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(destination, ignore_errors=True)
        raise OSError(f"branching {source} to {destination} by {method} failed: {done.stderr.strip()}")


def remove_branch(path: str | os.PathLike) -> None:
    shutil.rmtree(path, ignore_errors=True)


def allocated_bytes(path: str | os.PathLike) -> int:
    """Bytes the files under `path` occupy on disk (st_blocks). Blocks a clone shares with its
    source count in full here: what branches add to a filesystem is its used space's growth."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_FLAG_SYNC = 0x1
_FIEMAP_EXTENT_LAST = 0x1
_FIEMAP_EXTENT_SHARED = 0x2000
_FIEMAP_HEADER = struct.Struct("=QQIIII")  # start, length, flags, mapped, count, reserved
_FIEMAP_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3 reserved
_EXTENTS_PER_CALL = 512


def unshared_bytes(path: str | os.PathLike) -> int:
    """Bytes of the files under `path` whose blocks no other file shares: what a branch made by
    reflink adds to its filesystem (the extents its writes copied), read from the kernel's
    extent map (FIEMAP; an extent without FIEMAP_EXTENT_SHARED is the file's own). For a full
    copy every extent is its own: its size, less any holes."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            file = os.path.join(root, name)
            if not stat.S_ISREG(os.lstat(file).st_mode):  # links, sockets
                continue
            with open(file, "rb") as handle:
                total += _own_extent_bytes(handle.fileno(), os.fstat(handle.fileno()).st_size)
    return total


def _own_extent_bytes(fd: int, size: int) -> int:
    """The bytes of the file's first `size` bytes held in extents no other file shares. Blocks
    past the end of the file (XFS preallocates there while a file grows, and frees them later)
    are not the file's content and are not counted."""
    own, start = 0, 0
    while True:
        request = bytearray(_FIEMAP_HEADER.size + _EXTENT_SIZE * _EXTENTS_PER_CALL)
        _FIEMAP_HEADER.pack_into(request, 0, start, 2**64 - 1 - start, _FIEMAP_FLAG_SYNC, 0, _EXTENTS_PER_CALL, 0)
        fcntl.ioctl(fd, _FS_IOC_FIEMAP, request)
        mapped = _FIEMAP_HEADER.unpack_from(request, 0)[3]
        if mapped == 0:
            return own
        for index in range(mapped):
            extent = _FIEMAP_EXTENT.unpack_from(request, _FIEMAP_HEADER.size + index * _EXTENT_SIZE)
            logical, length, flags = extent[0], extent[2], extent[5]
            if not flags & _FIEMAP_EXTENT_SHARED and logical < size:
                own += min(logical + length, size) - logical
            if flags & _FIEMAP_EXTENT_LAST:
                return own
            start = logical + length


_EXTENT_SIZE = _FIEMAP_EXTENT.size
