"""Images built FROM other images of launch/images (cua_jax/envs/images.py: a `parent` file),
and which image a task starts on (cua_jax/tasks/runnable.py: OSWorld's snapshot names)."""

from __future__ import annotations

import dataclasses

import pytest

from cua_jax.envs import images
from cua_jax.tasks import runnable as R
from cua_jax.tasks.schema import load_suite
from cua_jax.tasks.suites.apps.solutions import SUITE_DIR as APPS_DIR


@pytest.fixture
def image_dir(tmp_path, monkeypatch):
    """An images folder of its own: base, office (FROM base), apps (FROM office), web (FROM base)."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "build.sh").write_text("echo base\n")
    for name, parent in (("office", None), ("apps", "office"), ("web", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "Dockerfile").write_text(f"ARG BASE_IMAGE\nFROM ${{BASE_IMAGE}}\n# {name}\n")
        if parent:
            (tmp_path / name / "parent").write_text(f"{parent}  # built FROM it\n")
    monkeypatch.setattr(images, "IMAGES_DIR", tmp_path)
    monkeypatch.setattr(images, "REPO_ROOT", tmp_path)
    return tmp_path


def test_a_parent_file_builds_an_image_from_another(image_dir):
    assert images.parent("base") is None
    assert images.parent("office") == images.parent("web") == "base"
    assert images.parent("apps") == "office"
    assert images.lineage("apps") == ["apps", "office", "base"]
    # A change to the parent changes the child's tag (it is rebuilt), not the other way round.
    apps, office, web = (images.content_hash(n) for n in ("apps", "office", "web"))
    (image_dir / "office" / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n# office, changed\n")
    office_changed = images.content_hash("office")
    assert images.content_hash("apps") != apps and office_changed != office
    assert images.content_hash("web") == web
    (image_dir / "apps" / "Dockerfile").write_text("changed\n")
    assert images.content_hash("office") == office_changed


def test_the_covering_image_is_built_from_all_the_others(image_dir):
    assert images.covering_image({"office", "apps"}) == "apps"
    assert images.covering_image({"base", "office"}) == "office"
    assert images.covering_image({"apps"}) == "apps"
    assert images.covering_image({"apps", "web"}) is None  # siblings: no pool runs both
    assert images.covering_image(set()) is None


def test_a_bad_parent_is_named(image_dir):
    (image_dir / "web" / "parent").write_text("nowhere\n")
    with pytest.raises(ValueError, match=r"web/parent: no image 'nowhere'"):
        images.parent("web")
    (image_dir / "web" / "parent").write_text("apps\n")
    (image_dir / "office" / "parent").write_text("web\n")
    with pytest.raises(ValueError, match="form a cycle: apps -> office -> web -> apps"):
        images.lineage("apps")


def test_osworld_snapshots_start_on_the_image_with_their_applications():
    assert images.lineage("osworld_apps") == ["osworld_apps", "osworld", "base"]
    tasks = {task.id: task for task in load_suite(APPS_DIR)}
    assert {R.task_image(task) for task in tasks.values()} == {"osworld_apps"}  # chrome, gimp, vlc
    chrome = tasks["chrome-do-not-track"]
    assert chrome.snapshot == "chrome"
    assert R.image_mismatch(chrome, "osworld_apps") is None
    assert R.image_mismatch(chrome, "osworld") == (
        "needs image: osworld_apps (snapshot 'chrome'; osworld is not built from it)"
    )
    office = dataclasses.replace(chrome, snapshot="libreoffice_calc")
    assert R.task_image(office) == "osworld" and R.image_mismatch(office, "osworld_apps") is None
