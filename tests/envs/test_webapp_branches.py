"""Branches of an application's state (`cua_jax.envs.webapp.branches`): the method the
filesystem allows, a branch that fails leaves nothing, and the extent map's count of what a
branch owns."""

from __future__ import annotations

import os

import pytest

from cua_jax.envs.webapp.branches import BRANCH_METHODS, branch, branch_method, unshared_bytes


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
    if method == "reflink":
        assert unshared_bytes(tmp_path / "b1") == 0  # a clone owns nothing until it writes
        with open(tmp_path / "b1" / "db" / "trac.db", "r+b") as db:
            db.write(b"x" * 10)
        assert 0 < unshared_bytes(tmp_path / "b1") < full


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
