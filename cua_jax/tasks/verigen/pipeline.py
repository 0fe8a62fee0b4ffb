"""The VeriGen loop: propose, validate, judge, dry-run, fix; write what is accepted.

    verigen = VeriGen(proposer, judger, checker, fixer, LoopConfig())
    report = verigen.run(target=50, max_candidates=120, workers=4, progress=print_progress)
    write_tasks(report.accepted, out_dir)

Each worker call asks the proposer for `candidates_per_call` (3) candidates and takes
them through the loop in parallel. A role left out (None, or disabled in the config)
is skipped, which is how the role ablation (ScaleCUA Table 4) runs. The static roles run
before the checker, so a candidate they reject never costs an environment.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from cua_jax.tasks.schema import load_suite
from cua_jax.tasks.verigen import rules
from cua_jax.tasks.verigen.candidate import Candidate, Feedback

log = logging.getLogger(__name__)


class Proposer(Protocol):
    def propose(self, n: int, knowledge: str = "", observation: str = "") -> list[Candidate]: ...


class ProposalError(RuntimeError):
    """The proposer's output could not be turned into a candidate (the reason says why)."""


@dataclasses.dataclass
class LoopConfig:
    use_rules: bool = True
    use_judger: bool = True
    use_fixer: bool = True
    max_fix_rounds: int = 2
    candidates_per_call: int = 3


@dataclasses.dataclass
class Result:
    """What became of one candidate (or of one proposal that never became one)."""

    candidate: Candidate | None
    accepted: bool
    reason: str = ""
    rejected_by: str | None = None
    seconds: float = 0.0


@dataclasses.dataclass
class Report:
    results: list[Result] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    cost_usd: float = 0.0

    @property
    def accepted(self) -> list[Candidate]:
        return [r.candidate for r in self.results if r.accepted]

    def summary(self) -> dict[str, Any]:
        """Candidates, accepted, executable rate (judges that executed correctly in the
        live dry run, over dry runs), mean latency per candidate, cost per accepted task."""
        checked = [f for r in self.results if r.candidate for f in r.candidate.history if f.role == "checker"]
        accepted = len(self.accepted)
        rejected = collections.Counter(r.rejected_by or "proposer" for r in self.results if not r.accepted)
        return {
            "candidates": len(self.results),
            "accepted": accepted,
            "acceptance_rate": accepted / len(self.results) if self.results else 0.0,
            "dry_runs": len(checked),
            "executable_rate": sum(f.passed for f in checked) / len(checked) if checked else 0.0,
            "repaired": sum(bool(r.candidate and r.candidate.repairs) for r in self.results if r.accepted),
            "rejected_by": dict(sorted(rejected.items())),
            "rejections": [r.reason[:300] for r in self.results if not r.accepted],
            "mean_latency_s": sum(r.seconds for r in self.results) / len(self.results) if self.results else 0.0,
            "wall_s": self.seconds,
            "cost_usd": self.cost_usd,
            "cost_per_accepted_usd": self.cost_usd / accepted if accepted else None,
            "accepted_by_app": dict(
                sorted(collections.Counter(c.metadata.get("app", "?") for c in self.accepted).items())
            ),
        }


class VeriGen:
    def __init__(
        self,
        proposer: Proposer,
        judger,
        checker,
        fixer,
        config: LoopConfig | None = None,
        knowledge: str = "",
        cost: Callable[[], float] = lambda: 0.0,
        observe: Callable[[], str] | None = None,
    ):
        """knowledge: the environment's knowledge document; observe: returns the text of a
        fresh environment's screen (taken through the probe) for the proposer; cost: the
        ledger's running cost in USD."""
        self.proposer, self.judger, self.checker, self.fixer = proposer, judger, checker, fixer
        self.config = config if config is not None else LoopConfig()
        self.knowledge, self.cost, self.observe = knowledge, cost, observe
        self._propose_lock = threading.Lock()

    def process(self, candidate: Candidate) -> Result:
        """Take one candidate through validation, review, dry run and repair rounds."""
        started, config = time.monotonic(), self.config
        for round_index in range(config.max_fix_rounds + 1):
            failed = self._review(candidate)
            if failed is None:
                return Result(candidate, True, seconds=time.monotonic() - started)
            last_round = round_index == config.max_fix_rounds
            fixed = None
            if config.use_fixer and self.fixer is not None and not last_round:
                try:
                    fixed = self.fixer.fix(candidate, [failed])
                except ProposalError as error:
                    failed = Feedback("fixer", False, [str(error)])
                    candidate.history.append(failed)
            if fixed is None:
                return Result(candidate, False, failed.summary(), failed.role, time.monotonic() - started)
            fixed.history = candidate.history
            candidate = fixed
        raise AssertionError("unreachable")

    def _review(self, candidate: Candidate) -> Feedback | None:
        """The first failing role's feedback, or None when every enabled role passes."""
        stages = []
        if self.config.use_rules:
            stages.append(("rule", rules.validate))
        if self.config.use_judger and self.judger is not None:
            stages.append(("judger", self.judger.review))
        stages.append(("checker", self.checker.check))
        for role, stage in stages:
            try:
                feedback = stage(candidate)
            except Exception as error:  # a role must not take the loop down with one odd candidate
                log.exception("the %s failed on %s", role, candidate.id)
                feedback = Feedback(
                    role, False, [f"the {role} failed on this candidate: {type(error).__name__}: {error}"], 0.0
                )
            candidate.history.append(feedback)
            if not feedback.passed:
                return feedback
        return None

    def _call(self) -> list[Result]:
        """One worker call: propose a batch, process its candidates in parallel."""
        started = time.monotonic()
        try:
            observation = self.observe() if self.observe is not None else ""
        except Exception as error:  # noqa: BLE001 - an observation is context for the proposer, not a requirement
            log.warning("no observation for the proposer: %s", error)
            observation = ""
        try:
            # a programmatic proposer draws from one random stream; an LLM one is called in parallel
            with self._propose_lock if getattr(self.proposer, "serial", True) else contextlib.nullcontext():
                batch = self.proposer.propose(self.config.candidates_per_call, self.knowledge, observation)
        except ProposalError as error:
            return [Result(None, False, f"proposer: {error}", "proposer", time.monotonic() - started)]
        results = []
        for item in batch:
            if isinstance(item, ProposalError):
                results.append(Result(None, False, f"proposer: {item}", "proposer", time.monotonic() - started))
        candidates = [c for c in batch if isinstance(c, Candidate)]
        with concurrent.futures.ThreadPoolExecutor(max(1, len(candidates))) as executor:
            results += list(executor.map(self.process, candidates))
        return results

    def run(
        self, target: int, max_candidates: int, workers: int = 4, progress: Callable[[Report], None] | None = None
    ) -> Report:
        """Run calls on `workers` threads until `target` tasks are accepted or
        `max_candidates` candidates were tried."""
        report, lock, started = Report(), threading.Lock(), time.monotonic()
        per_call = self.config.candidates_per_call

        def worker() -> None:
            while True:
                with lock:
                    if len(report.accepted) >= target or len(report.results) + pending[0] >= max_candidates:
                        return
                    pending[0] += per_call
                try:
                    results = self._call()
                finally:
                    with lock:
                        pending[0] -= per_call
                with lock:
                    report.results.extend(results)
                    report.seconds = time.monotonic() - started
                    report.cost_usd = self.cost()
                    if progress:
                        progress(report)

        pending = [0]
        threads = [threading.Thread(target=worker, name=f"verigen-worker-{i}") for i in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        report.seconds, report.cost_usd = time.monotonic() - started, self.cost()
        return report


def write_tasks(candidates: list[Candidate], out_dir: str | pathlib.Path) -> list[pathlib.Path]:
    """Write each accepted task as OSWorld JSON (tasks/<id>.json, with metadata and the
    validation record) and its judge as a Python file (judges/<id>.py)."""
    out = pathlib.Path(out_dir)
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    (out / "judges").mkdir(parents=True, exist_ok=True)
    paths = []
    for candidate in candidates:
        path = out / "tasks" / f"{candidate.id}.json"
        value = candidate.to_task_json()
        value["metadata"]["judge_file"] = f"judges/{candidate.id}.py"
        path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
        (out / "judges" / f"{candidate.id}.py").write_text(candidate.judge_code)
        paths.append(path)
    return paths


def _read_folder(folder: pathlib.Path) -> list[Candidate]:
    """The candidates of a folder of task JSON files, validated by the task schema
    (a bad file raises TaskSchemaError naming it and the bad field)."""

    return [Candidate.from_task_json(task.raw) for task in load_suite(folder)]


def read_tasks(out_dir: str | pathlib.Path) -> list[Candidate]:
    """The tasks `write_tasks` wrote, validated by the task schema."""
    return _read_folder(pathlib.Path(out_dir) / "tasks")


def read_task_dirs(dirs: list[str | pathlib.Path] | tuple[str | pathlib.Path, ...]) -> dict[str, Candidate]:
    """The tasks of OSWorld-format task folders by id: each folder is a VeriGen output
    folder (its tasks/) or a folder of task JSON files. A missing or empty folder, or a
    task id in two files, raises ValueError."""
    tasks: dict[str, Candidate] = {}
    sources: dict[str, pathlib.Path] = {}
    for folder in map(pathlib.Path, dirs):
        if not folder.is_dir():
            raise ValueError(f"task folder {folder} does not exist")
        source = folder / "tasks" if (folder / "tasks").is_dir() else folder
        candidates = _read_folder(source)
        if not candidates:
            raise ValueError(f"task folder {source} holds no task files (*.json)")
        for candidate in candidates:
            if candidate.id in tasks:
                raise ValueError(f"task id {candidate.id!r} is in both {sources[candidate.id]} and {source}")
            tasks[candidate.id], sources[candidate.id] = candidate, source
    return tasks
