"""Pretraining a base policy: supervised learning on the MiniWoB oracle's demonstrations across
many tasks, long and resumable, scored on held-out pages as it goes, exported as a Hugging
Face directory that a training run loads with `model.init_from`.

    python -m experiments.pretrain --config=experiments/configs/pretrain.py [--workdir=DIR]

It is the warm start (`cua_jax.train.warm_start`) at the scale of a base model:

1. Demonstrations: the oracle plays `warm_start.demos_per_task` training seeds of every task
   in `env.tasks` through the real agent loop (the run's prompt style, action space and
   segmenter), and `warm_start.held_out_seeds` seeds past the evaluation seeds for scoring.
   They are written once to <workdir>/demonstrations.pkl.gz (token streams and screenshots),
   so a resumed run, or one on a machine without a browser, reads them instead.
2. Supervised learning (`SupervisedRun`: the `Learner` with its supervised objective):
   token-mean NLL of the oracle's replies. Its whole state (the learner's train state, the
   batch order, the loss curve) is saved every `pretrain.checkpoint_every` steps
   (<workdir>/sft_state.pkl), and a rerun with the same workdir continues from there, exactly.
3. Every `pretrain.eval_every` steps: NLL per reply token and per click-target digit (grid
   point or element id) on the held-out pages, against a page-blind prior; metrics.jsonl,
   TensorBoard and pretrain_curve.png.
4. At the end: greedy success on `pretrain.eval_seeds` held-out pages per task, then the HF
   directory (config.json, model.safetensors, tokenizer, processor) with manifest.json: the
   recipe, the commit, the demonstration seeds, the held-out metrics and the wall time.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import pickle
import subprocess
import time
from typing import Any

import numpy as np

from cua_jax.compilation import use_compilation_cache
from cua_jax.context.render import ChatRenderer
from cua_jax.context.segment import make_segmenter
from cua_jax.eval.in_process import evaluate_model_in_process
from cua_jax.models.qwen3_vl import export_qwen3_vl
from cua_jax.observe.metrics import MetricWriter
from cua_jax.observe.plots import plot_curves
from cua_jax.train.batching import MultimodalPositions
from cua_jax.train.build import build_policy, load_run_processor
from cua_jax.train.demonstrations import Demonstrations, collect_demonstrations
from cua_jax.train.settings import ConfigError
from cua_jax.train.sft import DemonstrationData, SupervisedRun
from cua_jax.train.warm_start_diagnostics import HeldOutScorer
from cua_jax.types import EpisodeStatus

DEMONSTRATIONS_FILE = "demonstrations.pkl.gz"
STATE_FILE = "sft_state.pkl"
MANIFEST_FILE = "manifest.json"


def _atomic_write(path: str, payload: bytes) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(payload)
    os.replace(tmp, path)


def save_demonstrations(path: str, demonstrations: dict[str, Demonstrations], meta: dict[str, Any]) -> None:
    """Both sets (and what made them) as one gzip'd pickle; MiniWoB screenshots compress well."""
    _atomic_write(path, gzip.compress(pickle.dumps({"meta": meta, **demonstrations}, pickle.HIGHEST_PROTOCOL), 6))


def load_demonstrations(path: str) -> tuple[dict[str, Demonstrations], dict[str, Any]]:
    with gzip.open(path, "rb") as f:
        payload = pickle.load(f)
    meta = payload.pop("meta")
    return payload, meta


def git_commit(root: str | None = None) -> str:
    """The checkout's commit (with "+changes" when the tree differs from it), or "unknown"."""
    root = root or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Pretrainer:
    """One pretraining run in `settings.workdir` (see the module doc); `run()` does all of it and
    returns the manifest. settings: the run's config checked (`TrainSettings.from_config`);
    pretrain: its pretrain section (`pretrain_settings`)."""

    def __init__(self, settings, pretrain):
        self.settings, self.pretrain = settings, pretrain
        use_compilation_cache(settings.compilation_cache_dir)
        if self.settings.warm_start is None:
            raise ConfigError("config.warm_start.steps: pretraining needs supervised steps (> 0)")
        if self.settings.warm_start.held_out_seeds < 1:
            raise ConfigError("config.warm_start.held_out_seeds: pretraining scores held-out pages; set it >= 1")
        self.workdir = settings.workdir
        os.makedirs(self.workdir, exist_ok=True)
        self.tokenizer, self.image_processor = load_run_processor(settings.model)
        self.renderer = ChatRenderer(self.tokenizer, self.image_processor)
        self.segmenter = make_segmenter(settings.segmenter, self.renderer, **self.settings.segmenter_options)
        self.policy = build_policy(self.settings, self.settings.seed)
        self.tasks = list(settings.miniwob_tasks)
        self.train_seeds = range(self.settings.warm_start.demos_per_task)
        # Past the main run's evaluation seeds: held out from training and from its evaluations.
        first = self.settings.env.eval_seed_start + self.settings.eval.num_seeds
        self.held_out_seeds = range(first, first + self.settings.warm_start.held_out_seeds)
        self.eval_seeds = range(self.held_out_seeds.stop, self.held_out_seeds.stop + pretrain.eval_seeds)
        # The demonstrations' budgets: training's and evaluation's, whichever is larger.
        self.agent = dataclasses.replace(
            self.settings.agent, max_turns=max(self.settings.rollout.max_turns, self.settings.eval.max_turns)
        )
        self._writer = None

    # -- demonstrations ---------------------------------------------------------------------

    def _runtime(self):
        return self.settings.kind_configs["miniwob"].runtime(
            include_dom_text=True, action_space=self.settings.env.action_space, seed=self.settings.seed
        )

    def demonstrations(self) -> dict[str, Demonstrations]:
        path = os.path.join(self.workdir, DEMONSTRATIONS_FILE)
        meta = {
            "tasks": self.tasks,
            "train_seeds": [self.train_seeds.start, self.train_seeds.stop],
            "held_out_seeds": [self.held_out_seeds.start, self.held_out_seeds.stop],
            "action_space": self.settings.env.action_space,
            "prompt_style": self.settings.rollout.prompt_style,
            "segmenter": self.settings.segmenter,
        }
        if os.path.exists(path):
            sets, saved = load_demonstrations(path)
            if saved != meta:
                raise ValueError(f"{path} was made for {saved}, not this config's {meta}: use another workdir")
            print(
                f"pretrain: read {len(sets['train'].rollouts)} + {len(sets['held_out'].rollouts)} "
                f"demonstrations from {path}"
            )
            return sets
        start = time.perf_counter()
        with self._runtime() as runtime:
            common = dict(
                runtime=runtime,
                segmenter=self.segmenter,
                agent_config=self.agent,
                time_limit_s=self.settings.env.time_limit_s,
                concurrency=self.settings.warm_start.concurrency,
            )
            sets = {
                "train": collect_demonstrations(self.tasks, self.train_seeds, **common),
                "held_out": collect_demonstrations(self.tasks, self.held_out_seeds, **common),
            }
        save_demonstrations(path, sets, meta)
        print(
            f"pretrain: {len(sets['train'].rollouts)} training and {len(sets['held_out'].rollouts)} held-out "
            f"demonstrations ({len(sets['train'].items)} items) in {time.perf_counter() - start:.0f} s -> {path}"
        )
        return sets

    # -- the run ----------------------------------------------------------------------------

    @property
    def writer(self):
        if self._writer is None:
            self._writer = MetricWriter(self.workdir)
        return self._writer

    def _save_state(self, sft: SupervisedRun, history: list[dict[str, float]]) -> None:
        state = {"sft": sft.state_dict(), "history": history}
        _atomic_write(os.path.join(self.workdir, STATE_FILE), pickle.dumps(state, pickle.HIGHEST_PROTOCOL))

    def run(self) -> dict[str, Any]:
        config, every = self.settings.warm_start, self.pretrain
        start = time.perf_counter()
        commit = git_commit()  # the code this run starts with, not what the checkout holds when it ends
        sets = self.demonstrations()
        train, held_out = sets["train"], sets["held_out"]
        if not train.rollouts or not held_out.rollouts:
            raise RuntimeError(
                "the oracle succeeded on no training or no held-out episode: "
                f"{train.rejected[:3]} {held_out.rejected[:3]}"
            )
        multimodal = MultimodalPositions.of(self.policy.config)
        data = DemonstrationData(
            train.items,
            train.episodes,
            self.image_processor,
            multimodal,
            config.rows,
            config.length_multiple,
            pad_id=int(self.tokenizer.pad_token_id or 0),
        )
        scorer = HeldOutScorer.build(train, held_out, self.renderer, multimodal, config)
        sft = SupervisedRun(self.policy, data, config)
        state_path = os.path.join(self.workdir, STATE_FILE)
        history: list[dict[str, float]] = []  # the held-out scores so far, kept across resumes
        if os.path.exists(state_path):
            with open(state_path, "rb") as f:
                state = pickle.load(f)
            sft.load_state_dict(state["sft"])
            history = state["history"]
            print(f"pretrain: resumed at step {sft.step} of {config.steps}")

        progress, on_step = None, None
        if self.settings.train.progress_bar:
            from tqdm import tqdm

            progress = tqdm(total=config.steps, initial=sft.step, desc=f"{self.settings.name} pretrain", unit="step")

            def on_step(step: int, loss: float) -> None:
                progress.update(1)
                progress.set_postfix(nll=f"{loss:.3f}")

        try:
            while sft.step < config.steps:
                marks = [config.steps, (sft.step // every.checkpoint_every + 1) * every.checkpoint_every]
                if every.eval_every:
                    marks.append((sft.step // every.eval_every + 1) * every.eval_every)
                until = min(marks)
                losses_before = sft.step
                sft.run(until, on_step)
                metrics = {"pretrain/loss": float(np.mean(sft.losses[losses_before:])), "pretrain/seconds": sft.seconds}
                if until == config.steps or (every.eval_every and until % every.eval_every == 0):
                    report = scorer(sft.learner)
                    metrics.update({f"pretrain/{k}": v for k, v in report.items()})
                    history.append({"step": sft.step, **report})
                self.writer.write(sft.step, metrics)
                self._save_state(sft, history)
        finally:
            if progress is not None:
                progress.close()
        self.writer.flush()
        model = sft.sync_model()
        # The loop scores its last step; a rerun of a finished run has that score in its history.
        if history and history[-1]["step"] == sft.step:
            report = {name: value for name, value in history[-1].items() if name != "step"}
        else:
            report = scorer(sft.learner)
        evaluation = self.greedy_success(model)
        manifest = {
            "recipe": self.settings.config_dict,
            "commit": commit,
            "tasks": self.tasks,
            "action_space": self.settings.env.action_space,
            "demonstration_seeds": {
                "train": [self.train_seeds.start, self.train_seeds.stop],
                "held_out_scoring": [self.held_out_seeds.start, self.held_out_seeds.stop],
                "held_out_success": [self.eval_seeds.start, self.eval_seeds.stop],
            },
            "demonstrations": {
                "train": len(train.rollouts),
                "items": len(train.items),
                "held_out": len(held_out.rollouts),
                "rejected": len(train.rejected),
            },
            "steps": sft.step,
            "final_loss": float(np.mean(sft.losses[-50:])),
            "held_out": report,
            "held_out_success": evaluation,
            "history": history,
            "sft_seconds": sft.seconds,
            "wall_seconds": time.perf_counter() - start,
        }
        self._export(model, manifest)
        self._plot()
        return manifest

    def greedy_success(self, model) -> dict[str, Any]:
        """Greedy success per task on pages no demonstration used."""
        agent = dataclasses.replace(self.settings.eval_agent, temperature=0.0, seed_per_turn=False, seed=None)
        with self._runtime() as runtime:
            result = evaluate_model_in_process(
                model,
                self.tasks,
                self.eval_seeds,
                runtime=runtime,
                segmenter=self.segmenter,
                agent_config=agent,
                time_limit_s=self.settings.env.time_limit_s,
                concurrency=self.settings.eval.concurrent_groups,
            )
        per_task: dict[str, list[bool]] = {}
        for episode in result.episodes:
            per_task.setdefault(episode.task_id, []).append(episode.status is EpisodeStatus.SUCCESS)
        return {
            "success_rate": result.success_rate,
            "valid_action_rate": result.valid_action_rate,
            "episodes": len(result.episodes),
            "per_task": {task: float(np.mean(v)) for task, v in sorted(per_task.items())},
        }

    def export_dir(self) -> str:
        return self.pretrain.export_dir or os.path.join(self.workdir, "base")

    def _export(self, model, manifest: dict[str, Any]) -> None:
        directory = self.export_dir()
        # The shipped tokenizer is copied byte for byte; any other is written by its own save.
        tokenizer = self.tokenizer if self.settings.model.tokenizer_source else None
        export_qwen3_vl(model, directory, tokenizer=tokenizer, image_processor=self.image_processor)
        with open(os.path.join(directory, MANIFEST_FILE), "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")

    def _plot(self) -> None:
        plot_curves(
            self.writer.jsonl_path,
            ["pretrain/loss", "pretrain/held_out_nll", "pretrain/held_out_click_nll", "pretrain/click_prior_nll"],
            os.path.join(self.workdir, "pretrain_curve.png"),
            title=f"{self.settings.name}: pretraining",
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
