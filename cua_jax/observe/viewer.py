"""The trajectory viewer: a self-contained static site (HTML, CSS, a little vanilla JS; no
network) made from a run's workdir.

    build_site(["runs/a"], "site")              # site/index.html
    build_site(["runs/a", "runs/b"], "site")    # plus site/other/ and side-by-side comparisons

A run's pages: the index (learning curves drawn from metrics.jsonl and learning_curve.png,
success and quarantines per task from episodes.jsonl, the traced episodes with filters by
task and outcome) and one page per traced episode (traces/<label>/<k>/trace.json, written by
`cua_jax.eval.held_out.save_traces`): each turn's screenshot with the action's point, drag or
element box drawn over it, the reply's tokens shaded by rollout logprob, learner logprob or
their gap, rewards, advantages, policy versions, staleness and the quarantine reason. With a
second run, compare/ pairs the traced episodes of both runs with the same evaluation label and
episode id (held-out episode ids name the task and seed, the same in every run).
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from cua_jax.envs.faults import fault_kind_of
from cua_jax.observe.episode_log import EPISODE_LOG, EpisodeRecord, read_episode_log
from cua_jax.observe.metrics import read_metrics

CURVE_KEYS = ("reward/mean", "success/rate", "groups/informative_fraction", "learner/loss", "learner/entropy")
OUTCOMES = ("success", "failure", "no_verdict", "quarantined")

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 12px 20px; color: #222; }
nav a { margin-right: 14px; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 26px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; }
th { background: #f3f3f3; }
.success { color: #17803a; } .failure { color: #b3261e; }
.no_verdict { color: #9a6700; } .quarantined { color: #6a3fb5; }
.curves { display: flex; flex-wrap: wrap; gap: 10px; }
.curve { border: 1px solid #ddd; padding: 4px; }
.curve text { font-size: 10px; fill: #444; }
.curve polyline { fill: none; stroke: #1f6feb; stroke-width: 1.5; }
.learning-curve { max-width: 100%; border: 1px solid #ddd; }
.facts span { display: inline-block; margin-right: 16px; }
.turn { border-top: 1px solid #ccc; padding: 8px 0; display: flex; gap: 16px; align-items: flex-start; }
.shot { position: relative; display: inline-block; line-height: 0; }
.shot img { display: block; image-rendering: pixelated; }
.shot svg { position: absolute; left: 0; top: 0; width: 100%; height: 100%; pointer-events: none; }
.marker { fill: rgba(255, 30, 30, 0.35); stroke: #ff1e1e; stroke-width: 2; vector-effect: non-scaling-stroke; }
.drag { stroke: #ff1e1e; stroke-width: 2; vector-effect: non-scaling-stroke; marker-end: url(#arrow); }
.element-box { fill: rgba(31, 111, 235, 0.15); stroke: #1f6feb; stroke-width: 2.5; stroke-dasharray: 4 2;
               vector-effect: non-scaling-stroke; }
.reply { white-space: pre-wrap; font: 12px/1.5 ui-monospace, monospace; background: #fafafa; padding: 6px;
         border: 1px solid #eee; max-width: 640px; word-break: break-word; }
.tok { border-radius: 2px; }
.observation { font: 11px/1.3 ui-monospace, monospace; max-height: 140px; overflow: auto; white-space: pre-wrap;
               background: #f6f8fa; padding: 4px; max-width: 640px; }
.side { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
.side .turn { display: block; }
.side .shot img { max-width: 100%; }
.legend { font-size: 12px; color: #555; }
.filters select { margin-right: 12px; }
"""

SCRIPT = (
    """
(function () {
  function logprobColor(value) {  // unlikely tokens (low logprob) red
    if (value === null || isNaN(value)) return "transparent";
    var a = Math.min(1, -value / 5);
    return "rgba(230, 40, 40, " + (a * 0.75).toFixed(3) + ")";
  }
  function gapColor(value) {  // learner above rollout blue, below orange
    if (value === null || isNaN(value)) return "transparent";
    var a = Math.min(1, Math.abs(value) / 1.0) * 0.75;
    return value >= 0 ? "rgba(31, 111, 235, " + a.toFixed(3) + ")" : "rgba(230, 120, 0, " + a.toFixed(3) + ")";
  }
  function number(text) { return text === "" || text === undefined ? null : parseFloat(text); }
  function shade(mode) {
    document.querySelectorAll(".tok").forEach(function (span) {
      var r = number(span.dataset.rollout), l = number(span.dataset.learner);
      var color = mode === "rollout" ? logprobColor(r)
        : mode === "learner" ? logprobColor(l)
        : (r === null || l === null ? "transparent" : gapColor(l - r));
      span.style.backgroundColor = color;
    });
  }
  document.querySelectorAll("input[name=shade]").forEach(function (input) {
    input.addEventListener("change", function () { shade(input.value); });
  });
  if (document.querySelector(".tok")) shade("rollout");
  function filter() {
    var task = document.getElementById("task-filter").value;
    var outcome = document.getElementById("outcome-filter").value;
    document.querySelectorAll("tr[data-task]").forEach(function (row) {
      var show = (!task || row.dataset.task === task)"""
    """ && (!outcome || !row.dataset.outcome || row.dataset.outcome === outcome);
      row.hidden = !show;
    });
  }
  ["task-filter", "outcome-filter"].forEach(function (id) {
    var select = document.getElementById(id);
    if (select) select.addEventListener("change", filter);
  });
})();
"""
)


@dataclasses.dataclass
class Trace:
    """One traced episode of a run: where it lies and its trace.json record."""

    label: str
    index: str
    folder: str
    record: dict[str, Any]

    @property
    def page(self) -> str:
        return f"episodes/{self.label}-{self.index}.html"


@dataclasses.dataclass
class Run:
    """What the viewer reads of a run directory."""

    path: str
    metrics: list[dict[str, Any]]
    episodes: list[EpisodeRecord]
    traces: list[Trace]
    curve_png: str | None

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path)) or self.path


def read_trace(path: str) -> dict[str, Any]:
    """A trace.json record; raises ValueError naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except ValueError as error:
        raise ValueError(f"{path}: not valid JSON: {error}") from None
    missing = [
        k for k in ("episode_id", "task_id", "status", "turns") if not isinstance(record, dict) or k not in record
    ]
    if missing:
        raise ValueError(f"{path}: not a trace record (missing {missing})")
    if not isinstance(record["turns"], list):
        raise ValueError(f"{path}: 'turns' must be a list")
    return record


def read_run(path: str) -> Run:
    """The metrics, episode log, traces and learning curve of a run directory (each optional,
    but a directory with none of them is no run: ValueError)."""
    if not os.path.isdir(path):
        raise ValueError(f"run directory {path!r} does not exist")
    metrics_path, episodes_path = os.path.join(path, "metrics.jsonl"), os.path.join(path, EPISODE_LOG)
    metrics = read_metrics(metrics_path) if os.path.exists(metrics_path) else []
    episodes = read_episode_log(episodes_path) if os.path.exists(episodes_path) else []
    traces = []
    traces_root = os.path.join(path, "traces")
    if os.path.isdir(traces_root):
        for label in sorted(os.listdir(traces_root)):
            label_dir = os.path.join(traces_root, label)
            if not os.path.isdir(label_dir):
                continue
            for index in sorted(os.listdir(label_dir)):
                trace_path = os.path.join(label_dir, index, "trace.json")
                if os.path.exists(trace_path):
                    traces.append(Trace(label, index, os.path.dirname(trace_path), read_trace(trace_path)))
    curve = os.path.join(path, "learning_curve.png")
    curve_png = curve if os.path.exists(curve) else None
    if not (metrics or episodes or traces or curve_png):
        raise ValueError(
            f"{path!r} is not a run directory: it holds no metrics.jsonl, {EPISODE_LOG}, "
            "traces/<label>/<k>/trace.json or learning_curve.png"
        )
    return Run(path, metrics, episodes, traces, curve_png)


# -- pieces ---------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _page(title: str, body: str, root: str) -> str:
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f'<link rel="icon" href="data:,"><link rel="stylesheet" href="{root}style.css"></head>'
        f'<body>{body}<script src="{root}viewer.js"></script></body></html>\n'
    )


def _nav(root: str, has_other: bool, pairs: bool) -> str:
    links = [f'<a href="{root}index.html">run</a>']
    if has_other:
        links.append(f'<a href="{root}other/index.html">other run</a>')
    if pairs:
        links.append(f'<a href="{root}compare/index.html">side by side</a>')
    return "<nav>" + "".join(links) + "</nav>"


def curve_svg(metrics: Sequence[Mapping[str, Any]], key: str, width: int = 260, height: int = 120) -> str:
    """An inline SVG line of metric `key` against step (its panel says so when it has no values)."""
    points = [(r["step"], r[key]) for r in metrics if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]
    pad = 28
    body = f'<text x="{pad}" y="12">{_e(key)}</text>'
    if not points:
        body += f'<text x="{pad}" y="{height // 2}">no values</text>'
    else:
        steps, values = zip(*points)
        x0, x1 = min(steps), max(steps)
        y0, y1 = min(values), max(values)
        sx = (width - pad - 8) / ((x1 - x0) or 1)
        sy = (height - 2 * 20) / ((y1 - y0) or 1)
        xy = " ".join(f"{pad + (x - x0) * sx:.1f},{height - 20 - (y - y0) * sy:.1f}" for x, y in points)
        body += (
            f'<polyline points="{xy}"/>'
            f'<text x="2" y="24">{_number(float(y1))}</text>'
            f'<text x="2" y="{height - 20}">{_number(float(y0))}</text>'
            f'<text x="{pad}" y="{height - 4}">step {x0}</text>'
            f'<text x="{width - 60}" y="{height - 4}">step {x1}</text>'
        )
    return (
        f'<svg class="curve" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{_e(key)}">{body}</svg>'
    )


def task_table(episodes: Sequence[EpisodeRecord]) -> str:
    """Per task: episodes, success rate over the scored (unquarantined), outcomes, quarantines."""
    rows: dict[str, dict[str, Any]] = {}
    for e in episodes:
        row = rows.setdefault(e.task_id, {"domain": e.domain, **{o: 0 for o in OUTCOMES}})
        row[e.status.value] += 1
    lines = []
    for task, row in sorted(rows.items()):
        scored = sum(row[o] for o in OUTCOMES if o != "quarantined")
        rate = row["success"] / scored if scored else None
        lines.append(
            f'<tr data-task="{_e(task)}"><td>{_e(task)}</td><td>{_e(row["domain"])}</td>'
            f"<td>{sum(row[o] for o in OUTCOMES)}</td><td>{_number(rate, 2)}</td>"
            + "".join(f"<td>{row[o]}</td>" for o in OUTCOMES)
            + "</tr>"
        )
    head = (
        "<tr><th>task</th><th>domain</th><th>episodes</th><th>success rate</th>"
        + "".join(f"<th>{o.replace('_', ' ')}</th>" for o in OUTCOMES)
        + "</tr>"
    )
    return f'<table id="tasks">{head}{"".join(lines)}</table>'


def _overlay(turn: Mapping[str, Any], width: int, height: int) -> str:
    """The SVG drawn over a screenshot: the action's point (a circle), drag (an arrow), the
    named element's box and id."""
    radius = max(3.0, min(width, height) / 25)
    shapes = [
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#ff1e1e"/></marker></defs>'
    ]
    points = turn.get("points") or []
    if len(points) == 2:
        (xa, ya), (xb, yb) = points
        shapes.append(
            f'<line class="drag" x1="{xa}" y1="{ya}" x2="{xb}" y2="{yb}"/>'
            f'<circle class="marker" cx="{xa}" cy="{ya}" r="{radius:.1f}"/>'
        )
    elif len(points) == 1:
        x, y = points[0]
        shapes.append(f'<circle class="marker" cx="{x}" cy="{y}" r="{radius:.1f}"/>')
    box = turn.get("element_box")
    if box:
        left, top, w, h = box
        shapes.append(
            f'<rect class="element-box" x="{left}" y="{top}" width="{w}" height="{h}"/>'
            f'<text x="{left}" y="{max(top - 2, 8)}" fill="#1f6feb" font-size="{max(8, height // 30)}">'
            f"{_e(turn.get('element'))}</text>"
        )
    return (
        f'<svg class="overlay" viewBox="0 0 {width} {height}" preserveAspectRatio="none">' + "".join(shapes) + "</svg>"
    )


def _reply(turn: Mapping[str, Any]) -> str:
    """The reply as token spans carrying their logprobs (the page's script shades them), or
    the plain reply when the trace holds no token ids."""
    ids = turn.get("token_ids") or []
    if not ids:
        return f'<div class="reply">{_e(turn.get("response"))}</div>'
    tokens = turn.get("tokens") or [f"⟨{i}⟩" for i in ids]
    rollout = turn.get("rollout_logprobs") or [None] * len(ids)
    learner = turn.get("learner_logprobs") or [None] * len(ids)
    spans = []
    for token, token_id, r, learned in zip(tokens, ids, rollout, learner):
        title = f"id {token_id} · rollout {_number(r)} · learner {_number(learned)}"
        if r is not None and learned is not None:
            title += f" · gap {_number(learned - r)}"
        spans.append(
            f'<span class="tok" data-rollout="{"" if r is None else r}" '
            f'data-learner="{"" if learned is None else learned}" title="{_e(title)}">{_e(token)}</span>'
        )
    return '<div class="reply">' + "".join(spans) + "</div>"


def _turn_html(t: int, turn: Mapping[str, Any], image_prefix: str) -> str:
    shots = []
    size = turn.get("screen_size")
    for name in turn.get("screenshots") or []:
        width, height = size if size else (100, 100)
        shots.append(
            f'<div class="shot"><img src="{_e(image_prefix + name)}" width="{width}" height="{height}" '
            f'style="width:{min(2 * width, 560)}px;height:auto" alt="turn {t} screenshot">'
            f"{_overlay(turn, width, height)}</div>"
        )
    facts = [
        f"<span>action <code>{_e(turn.get('action_arguments') and json.dumps(turn['action_arguments']))}</code></span>"
        if turn.get("action_arguments")
        else f"<span>action <code>{_e(turn.get('action'))}</code></span>",
        f"<span>reward {_number(turn.get('reward'))}</span>",
        f"<span>policy version {_number(turn.get('policy_version'))}</span>",
        f"<span>staleness {_number(turn.get('staleness'))}</span>",
    ]
    if turn.get("advantage") is not None:  # only training traces give turns their own advantage
        facts.insert(2, f"<span>advantage {_number(turn['advantage'])}</span>")
    if turn.get("invalid_action"):
        facts.append(f'<span class="failure">invalid action: {_e(turn["invalid_action"])}</span>')
    observation = (
        f'<details><summary>observation</summary><div class="observation">{_e(turn.get("observation_text"))}'
        "</div></details>"
        if turn.get("observation_text")
        else ""
    )
    return (
        f'<section class="turn" id="turn-{t}"><div>{"".join(shots)}</div><div><h3>turn {t}</h3>'
        f'<div class="facts">{"".join(facts)}</div>{observation}{_reply(turn)}</div></section>'
    )


def _episode_facts(record: Mapping[str, Any]) -> str:
    facts = [
        f'<span class="{_e(record["status"])}">status {_e(record["status"])}</span>',
        f"<span>reward {_number(record.get('reward'))}</span>",
        f"<span>advantage {_number(record.get('advantage'))}</span>",
        f"<span>policy version {_number(record.get('policy_version'))}</span>",
        f"<span>staleness {_number(record.get('staleness'))}</span>",
        f"<span>seed {_number(record.get('seed'))}</span>",
    ]
    if record.get("replay_of"):
        facts.append(
            f"<span>replayed success of {_e(record['replay_of'])}, sampled by policy version "
            f"{_number(record.get('policy_version'))}</span>"
        )
    if record.get("quarantine_reason"):
        facts.append(f'<span class="quarantined">quarantined: {_e(record["quarantine_reason"])}</span>')
    if fault_kind_of(record.get("end_reason")) is not None:  # a fault scored as the agent's failure
        facts.append(f'<span class="failure">agent fault: {_e(record["end_reason"])}</span>')
    if record.get("changes_outside_sources"):
        facts.append(
            f'<span class="failure">changes outside the sources: {_number(record["changes_outside_sources"])}</span>'
        )
    return f'<p class="facts">{"".join(facts)}</p><p>{_e(record.get("instruction"))}</p>'


SHADE_TOGGLE = (
    '<p class="legend">shade tokens by '
    '<label><input type="radio" name="shade" value="rollout" checked> rollout logprob</label> '
    '<label><input type="radio" name="shade" value="learner"> learner logprob</label> '
    '<label><input type="radio" name="shade" value="gap"> gap (learner − rollout)</label> · '
    "red: unlikely; gap blue: learner higher, orange: lower</p>"
)


def episode_page(trace: Trace, image_prefix: str, nav: str) -> str:
    record = trace.record
    body = (
        f"{nav}<h1>{_e(record['task_id'])} · {_e(record['episode_id'])}</h1>"
        f"<p>trace {_e(trace.label)}/{_e(trace.index)}</p>{_episode_facts(record)}{SHADE_TOGGLE}"
        + "".join(_turn_html(t, turn, image_prefix) for t, turn in enumerate(record["turns"]))
    )
    return _page(f"{record['task_id']} {record['episode_id']}", body, "../")


def index_page(run: Run, nav: str, curve_src: str | None) -> str:
    keys = [k for k in CURVE_KEYS if any(k in r for r in run.metrics)] + sorted(
        {k for r in run.metrics for k in r if k.startswith("eval_") and k.endswith("/success_rate")}
    )
    curves = "".join(curve_svg(run.metrics, k) for k in keys) or "<p>no metrics.jsonl</p>"
    picture = f'<img class="learning-curve" src="{curve_src}" alt="learning curve">' if curve_src else ""
    tasks = sorted({t.record["task_id"] for t in run.traces} | {e.task_id for e in run.episodes})
    filters = (
        '<p class="filters">task <select id="task-filter"><option value="">all</option>'
        + "".join(f'<option value="{_e(t)}">{_e(t)}</option>' for t in tasks)
        + '</select> outcome <select id="outcome-filter"><option value="">all</option>'
        + "".join(f'<option value="{o}">{o.replace("_", " ")}</option>' for o in OUTCOMES)
        + "</select></p>"
    )
    rows = []
    for trace in run.traces:
        r = trace.record
        rows.append(
            f'<tr data-task="{_e(r["task_id"])}" data-outcome="{_e(r["status"])}">'
            f'<td><a href="{trace.page}">{_e(trace.label)}/{_e(trace.index)}</a></td>'
            f"<td>{_e(r['task_id'])}</td><td>{_e(r['episode_id'])}</td>"
            f'<td class="{_e(r["status"])}">{_e(r["status"])}</td><td>{_number(r.get("reward"))}</td>'
            f"<td>{len(r['turns'])}</td><td>{_number(r.get('advantage'))}</td>"
            f"<td>{_number(r.get('staleness'))}</td><td>{_e(r.get('quarantine_reason'))}</td></tr>"
        )
    traces = (
        (
            '<table id="traces"><tr><th>trace</th><th>task</th><th>episode</th><th>status</th><th>reward</th>'
            "<th>turns</th><th>advantage</th><th>staleness</th><th>quarantine reason</th></tr>"
            + "".join(rows)
            + "</table>"
        )
        if rows
        else "<p>no traced episodes</p>"
    )
    body = (
        f"{nav}<h1>{_e(run.name)}</h1><p>{_e(os.path.abspath(run.path))}</p>"
        f'<h2>Curves</h2><div class="curves">{curves}</div>{picture}{filters}'
        f"<h2>Tasks</h2>{task_table(run.episodes) if run.episodes else '<p>no episodes.jsonl</p>'}"
        f"<h2>Traced episodes</h2>{traces}"
    )
    return _page(run.name, body, "")


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_run_site(run: Run, out: str, nav_for: Any) -> None:
    """One run's index and episode pages under `out`, its screenshots and curve copied there.
    nav_for(root) gives the navigation bar of a page `root` away from the site's top."""
    _write(os.path.join(out, "style.css"), STYLE)
    _write(os.path.join(out, "viewer.js"), SCRIPT)
    curve_src = None
    if run.curve_png:
        shutil.copyfile(run.curve_png, os.path.join(out, "learning_curve.png"))
        curve_src = "learning_curve.png"
    for trace in run.traces:
        images = os.path.join(out, "traces", trace.label, trace.index)
        os.makedirs(images, exist_ok=True)
        for turn in trace.record["turns"]:
            for name in turn.get("screenshots") or []:
                source = os.path.join(trace.folder, name)
                if not os.path.exists(source):
                    raise ValueError(f"{trace.folder}/trace.json names the screenshot {name!r}, which is missing")
                shutil.copyfile(source, os.path.join(images, name))
        _write(
            os.path.join(out, trace.page),
            episode_page(trace, f"../traces/{trace.label}/{trace.index}/", nav_for("../")),
        )
    _write(os.path.join(out, "index.html"), index_page(run, nav_for(""), curve_src))


def paired_traces(first: Run, second: Run) -> list[tuple[Trace, Trace]]:
    """The traced episodes of both runs with the same evaluation label and episode id."""
    theirs = {(t.label, t.record["episode_id"]): t for t in second.traces}
    return [
        (t, theirs[t.label, t.record["episode_id"]])
        for t in first.traces
        if (t.label, t.record["episode_id"]) in theirs
    ]


def comparison_page(first: Run, second: Run, pair: tuple[Trace, Trace], nav: str) -> str:
    columns = []
    for run, prefix, trace in ((first, "../", pair[0]), (second, "../other/", pair[1])):
        images = f"{prefix}traces/{trace.label}/{trace.index}/"
        columns.append(
            f'<div class="column"><h2><a href="{prefix}{trace.page}">{_e(run.name)}</a></h2>'
            f"{_episode_facts(trace.record)}"
            + "".join(_turn_html(t, turn, images) for t, turn in enumerate(trace.record["turns"]))
            + "</div>"
        )
    record = pair[0].record
    body = (
        f"{nav}<h1>{_e(record['task_id'])} · {_e(record['episode_id'])}: {_e(first.name)} | {_e(second.name)}</h1>"
        f'{SHADE_TOGGLE}<div class="side">{"".join(columns)}</div>'
    )
    return _page(f"compare {record['episode_id']}", body, "../")


def build_site(run_dirs: Sequence[str], out: str) -> str:
    """Writes the viewer site of one run (or two, compared) under `out`; returns the path of
    its index.html. The site is static and self-contained: open index.html in a browser."""
    if not 1 <= len(run_dirs) <= 2:
        raise ValueError(f"the viewer shows one run or compares two, got {len(run_dirs)} run directories")
    runs = [read_run(path) for path in run_dirs]
    pairs = paired_traces(runs[0], runs[1]) if len(runs) == 2 else []

    def nav_for(root: str) -> str:
        return _nav(root, len(runs) == 2, bool(pairs))

    write_run_site(runs[0], out, nav_for)
    if len(runs) == 2:
        write_run_site(runs[1], os.path.join(out, "other"), lambda root: nav_for("../" + root))
        rows = []
        for first, second in pairs:
            name = f"{first.label}-{first.record['episode_id'].replace('/', '_')}.html"
            _write(
                os.path.join(out, "compare", name), comparison_page(runs[0], runs[1], (first, second), nav_for("../"))
            )
            rows.append(
                f'<tr data-task="{_e(first.record["task_id"])}"><td><a href="{_e(name)}">{_e(first.label)} · '
                f"{_e(first.record['episode_id'])}</a></td><td>{_e(first.record['task_id'])}</td>"
                f'<td class="{_e(first.record["status"])}">{_e(first.record["status"])}</td>'
                f'<td class="{_e(second.record["status"])}">{_e(second.record["status"])}</td></tr>'
            )
        table = (
            f'<table id="pairs"><tr><th>episode</th><th>task</th><th>{_e(runs[0].name)}</th>'
            f"<th>{_e(runs[1].name)}</th></tr>{''.join(rows)}</table>"
            if rows
            else "<p>no traced episodes with the same label and episode id in both runs</p>"
        )
        _write(
            os.path.join(out, "compare", "index.html"),
            _page("side by side", f"{nav_for('../')}<h1>{_e(runs[0].name)} | {_e(runs[1].name)}</h1>{table}", "../"),
        )
    return os.path.join(out, "index.html")
