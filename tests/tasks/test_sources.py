"""Task sources: MiniWoB lists and folders of OSWorld-format task JSON (the desktop suite,
OSWorld's domain layout, VeriGen's output) in one catalog; per-domain sampling weights as the
pool's prior (a numpy reference for the weighted draw)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from cua_jax.tasks.schema import TaskSchemaError
from cua_jax.tasks.selection import uniform_select, weighted_select
from cua_jax.tasks.sources import TaskCatalog, load_task_folder, miniwob_tasks, parse_domain_weights
from cua_jax.tasks.suites.desktop.solutions import SUITE_DIR


def _task(task_id, **extra):
    return {
        "id": task_id,
        "instruction": f"do {task_id}",
        "config": [],
        "evaluator": {
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "echo a"},
            "expected": {"type": "rule", "rules": {"expected": "a"}},
        },
        **extra,
    }


def _write(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def test_the_desktop_suite_is_one_domain_with_its_infeasible_task():
    tasks = {t.task_id: t for t in load_task_folder(SUITE_DIR)}
    assert len(tasks) == 5 and {t.domain for t in tasks.values()} == {"desktop"}
    assert {t for t, task in tasks.items() if not task.feasible} == {"infeasible-photo-editor"}
    assert all(t.kind == "desktop" and t.spec.id == t.task_id for t in tasks.values())


def test_osworld_layout_takes_domains_from_folders_and_skips_the_index(tmp_path):
    _write(tmp_path / "examples" / "chrome" / "a.json", _task("a"))
    _write(tmp_path / "examples" / "os" / "b.json", _task("b"))
    _write(tmp_path / "examples" / "os" / "c.json", _task("c", domain="shell"))  # a field wins
    _write(tmp_path / "test_all.json", {"chrome": ["a"], "os": ["b", "c"]})
    tasks = {t.task_id: t.domain for t in load_task_folder(tmp_path)}
    assert tasks == {"a": "chrome", "b": "os", "c": "shell"}


def test_verigen_output_takes_the_folder_name(tmp_path):
    out = tmp_path / "synth"
    _write(out / "tasks" / "x.json", _task("x"))
    _write(out / "augmented" / "tasks" / "y.json", _task("y"))
    (out / "judges").mkdir()
    _write(out / "report.json", {"synthesis": {"accepted": 1}})
    assert {t.task_id: t.domain for t in load_task_folder(out)} == {"x": "synth", "y": "augmented"}


def test_bad_sources_name_the_problem(tmp_path):
    _write(tmp_path / "bad" / "t.json", {"id": "t", "instruction": "x"})
    with pytest.raises(TaskSchemaError, match=r"bad/t\.json.*evaluator"):
        load_task_folder(tmp_path / "bad")
    with pytest.raises(ValueError, match="holds no task files"):
        _write(tmp_path / "empty" / "index.json", {"a": [1]})
        load_task_folder(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_task_folder(tmp_path / "missing")
    _write(tmp_path / "dup" / "a.json", _task("click-button"))
    with pytest.raises(ValueError, match="'click-button' appears twice"):
        TaskCatalog(miniwob_tasks(["click-button"]) + load_task_folder(tmp_path / "dup"))
    for entry in ("desktop", "desktop=0", "=2", "desktop=x"):
        with pytest.raises(ValueError, match="is not 'domain=weight'"):
            parse_domain_weights([entry])
    with pytest.raises(ValueError, match="no task has"):
        TaskCatalog(miniwob_tasks(["click-button"])).pool({"desktop": 2.0})


def test_domain_weights_set_each_domains_share_whatever_its_task_count():
    catalog = TaskCatalog(miniwob_tasks(["click-button", "focus-text", "click-link"]) + load_task_folder(SUITE_DIR))
    pool = catalog.pool(parse_domain_weights(["desktop=3"]))
    shares = {d: pool.prior[[t.domain == d for t in pool.tasks]].sum() / pool.prior.sum() for d in pool.domains}
    assert shares == pytest.approx({"desktop": 0.75, "miniwob": 0.25})
    assert np.all(catalog.pool().prior == 1)  # no weights: every task the same
    assert catalog.pool(task_ids=["focus-text"]).task_ids == ["focus-text"]


def _numpy_weighted_order(gumbel, weights, eligible):
    scores = np.where(eligible, np.log(weights) + gumbel, -np.inf)
    return np.argsort(-scores, kind="stable")


def test_weighted_select_matches_numpy_and_equal_weights_give_the_uniform_order():
    select = jax.jit(weighted_select)
    rng = np.random.default_rng(0)
    for _trial in range(20):
        n = int(rng.integers(3, 12))
        gumbel = rng.gumbel(size=n).astype(np.float32)
        weights = rng.uniform(0.1, 3.0, n).astype(np.float32)
        eligible = rng.random(n) < 0.8
        k = int(eligible.sum())
        np.testing.assert_array_equal(
            np.asarray(select(gumbel, weights, eligible))[:k], _numpy_weighted_order(gumbel, weights, eligible)[:k]
        )
        np.testing.assert_array_equal(
            np.asarray(select(gumbel, np.ones(n, np.float32), eligible))[:k],
            np.asarray(uniform_select(gumbel, eligible))[:k],
        )


def test_first_draws_follow_the_weights():
    weights = np.asarray([1.0, 2.0, 5.0], np.float32)
    keys = jax.random.split(jax.random.key(0), 4000)
    gumbels = jax.vmap(lambda key: jax.random.gumbel(key, (3,)))(keys)
    firsts = np.asarray(jax.vmap(lambda g: weighted_select(g, weights, np.ones(3, bool))[0])(gumbels))
    np.testing.assert_allclose(np.bincount(firsts, minlength=3) / len(firsts), weights / weights.sum(), atol=0.03)
