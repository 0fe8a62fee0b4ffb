"""Branches of an application's state (`cua_jax.envs.webapp.branches`): the method the
filesystem allows, a branch that fails leaves nothing, and the extent map's count of what a
branch owns."""

from __future__ import annotations

import os

import pytest

from cua_jax.envs.webapp.branches import (
    BRANCH_METHODS,
    MAX_FROZEN_LAYERS,
    branch,
    branch_method,
    check_branch_method,
    files_clone,
    overlay_mounts,
    own_bytes,
    remove_branch,
    unshared_bytes,
)


@pytest.fixture(autouse=True)
def _no_mounts_left(tmp_path):
    """A failed test's overlay branches are unmounted too (pytest cannot remove a mount point)."""
    yield
    remove_branch(tmp_path)


def _state(root):
    (root / "db").mkdir(parents=True)
    (root / "db" / "trac.db").write_bytes(os.urandom(3 * 65536))
    (root / "files").mkdir()
    (root / "files" / "a.bin").write_bytes(os.urandom(5000))
    return root


def test_a_branch_is_a_copy_whatever_the_method_and_owns_what_it_holds(tmp_path):
    source = _state(tmp_path / "base")
    method = branch_method(tmp_path)
    assert method in BRANCH_METHODS
    branch(source, tmp_path / "b1", method)
    for name in ("db/trac.db", "files/a.bin"):
        assert (tmp_path / "b1" / name).read_bytes() == (source / name).read_bytes()
    full = 3 * 65536 + 5000
    copied = tmp_path / "b2"
    branch(source, copied, "copy")
    assert unshared_bytes(copied) >= full  # a copy owns every block (whole blocks: at least its bytes)
    if method in ("reflink", "overlay"):
        assert own_bytes(tmp_path / "b1") == 0  # a clone owns nothing until it writes
        with open(tmp_path / "b1" / "db" / "trac.db", "r+b") as db:
            db.write(b"x" * 10)
        assert 0 < own_bytes(tmp_path / "b1") < full


def test_a_failed_branch_leaves_nothing_and_a_taken_name_is_refused(tmp_path):
    source = _state(tmp_path / "base")
    with pytest.raises(OSError, match="by copy failed"):
        branch(tmp_path / "missing", tmp_path / "b", "copy")
    assert not (tmp_path / "b").exists()
    branch(source, tmp_path / "b", "copy")
    with pytest.raises(FileExistsError):
        branch(source, tmp_path / "b", "copy")
    with pytest.raises(ValueError, match="unknown branch method"):
        branch(source, tmp_path / "c", "hardlink")


def _mounted(path) -> bool:
    escaped = str(path).replace(" ", "\\040").replace("\t", "\\011")
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4].startswith(escaped) for line in table)


def test_overlay_branches_carry_their_parent_diverge_and_own_their_layers(tmp_path):
    why = overlay_mounts(tmp_path)
    if why is not None:
        pytest.skip(f"no overlay mounts here: {why}")
    source = _state(tmp_path / "base")
    original = {name: (source / name).read_bytes() for name in ("db/trac.db", "files/a.bin")}
    parent = tmp_path / "parent"
    branch(source, parent, "overlay")
    assert {name: (parent / name).read_bytes() for name in original} == original
    with open(parent / "db" / "trac.db", "r+b") as db:  # a write in place: the file is copied up
        db.write(b"parent")
    (parent / "files" / "a.bin").unlink()  # a whiteout in the upper layer
    (parent / "files" / "new.bin").write_bytes(b"new")
    assert {name: (source / name).read_bytes() for name in original} == original  # the source untouched

    child = tmp_path / "child"
    branch(parent, child, "overlay")
    assert (child / "db" / "trac.db").read_bytes()[:6] == b"parent"
    assert not (child / "files" / "a.bin").exists() and (child / "files" / "new.bin").read_bytes() == b"new"
    with open(parent / "db" / "trac.db", "r+b") as db:  # the parent goes on: the child keeps what it carried
        db.write(b"PARENT")
    (child / "files" / "child.bin").write_bytes(b"child")
    assert (child / "db" / "trac.db").read_bytes()[:6] == b"parent"
    assert not (parent / "files" / "child.bin").exists()

    remove_branch(parent)  # the child owns its layers: it outlives its parent
    assert not parent.exists() and not _mounted(parent)
    assert (child / "db" / "trac.db").read_bytes()[:6] == b"parent"
    assert own_bytes(child) >= len(b"child")  # its upper layer and the parent's, frozen

    # A chain of forks deeper than the layers a mount holds flattens and still carries everything.
    previous = child
    for depth in range(MAX_FROZEN_LAYERS + 2):
        nxt = tmp_path / f"chain{depth}"
        branch(previous, nxt, "overlay")
        (nxt / "files" / f"d{depth}.bin").write_bytes(b"%d" % depth)
        previous = nxt
    assert sorted(p.name for p in (previous / "files").iterdir()) == sorted(
        ["child.bin", "new.bin", *(f"d{d}.bin" for d in range(MAX_FROZEN_LAYERS + 2))]
    )
    remove_branch(tmp_path)  # every mount under a folder is detached with it
    assert not _mounted(tmp_path) and not tmp_path.exists()


def test_branch_methods_are_checked_against_the_folder(tmp_path):
    assert check_branch_method("auto", tmp_path) == branch_method(tmp_path)
    assert check_branch_method("copy", tmp_path) == "copy"
    with pytest.raises(ValueError, match="branch_by must be"):
        check_branch_method("hardlink", tmp_path)
    if not files_clone(tmp_path):
        with pytest.raises(ValueError, match="cannot clone files"):
            check_branch_method("reflink", tmp_path)
    if overlay_mounts(tmp_path) is not None:
        with pytest.raises(ValueError, match="no overlay can be mounted"):
            check_branch_method("overlay", tmp_path)
    else:  # only where files also clone would "auto" pick it: elsewhere each copy-up is a full copy
        assert (branch_method(tmp_path) == "overlay") == files_clone(tmp_path)


def test_a_mount_whose_path_the_mount_table_escapes_is_found_and_detached(tmp_path):
    if overlay_mounts(tmp_path) is not None:
        pytest.skip("no overlay mounts here")
    source = _state(tmp_path / "base")
    spaced = tmp_path / "a branch\twith blanks café"
    branch(source, spaced, "overlay")
    assert _mounted(tmp_path / "a branch")  # the table writes it as "a\\040branch\\011with\\040blanks"
    remove_branch(spaced)
    assert not spaced.exists() and not _mounted(tmp_path / "a branch")
