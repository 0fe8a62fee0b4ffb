"""The overlap audit of generated tasks against an evaluation pool (ScaleCUA Table 8).

    full-JSON duplicates         the task content (provenance fields dropped) equals an evaluation task's
    instruction duplicates       the normalised instruction equals an evaluation task's
    objective near-duplicates    the instruction's highest embedding similarity to the pool >= threshold
    judge exact reuse            the evaluator (metrics, getters, judge code) equals an evaluation task's
    similarity p50 / p95         of each generated task's highest similarity to the pool

Provenance (id, source, metadata, validation) is not content: a task is not leaked for
naming the seed it came from, only for copying its objective or judge.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import jax
import numpy as np

from cua_jax.tasks.verigen.candidate import canonical_json
from cua_jax.tasks.verigen.similarity import max_similarity

PROVENANCE_FIELDS = ("id", "source", "metadata", "validation")
_max_similarity = jax.jit(max_similarity)


def normalise_instruction(text: str) -> str:
    """Lower case, punctuation dropped, whitespace runs collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", " ", text.lower())).strip()


def content_key(task: dict[str, Any]) -> str:
    return hashlib.sha256(
        canonical_json({k: v for k, v in task.items() if k not in PROVENANCE_FIELDS}).encode()
    ).hexdigest()


def judge_key(task: dict[str, Any]) -> str:
    evaluator = {k: v for k, v in task.get("evaluator", {}).items() if k not in ("timeout", "postconfig")}
    return hashlib.sha256(canonical_json(evaluator).encode()).hexdigest()


def overlap_audit(
    generated: list[dict[str, Any]], evaluation: list[dict[str, Any]], embed, threshold: float = 0.90
) -> dict[str, Any]:
    """Table 8's row for `generated` tasks (JSON dicts) against the `evaluation` pool.

    embed: a callable of a list of texts returning unit-length embeddings [N, D].
    """
    if not evaluation:
        raise ValueError("the evaluation pool is empty")
    n = len(generated)
    content = {content_key(t) for t in evaluation}
    instructions = {normalise_instruction(t.get("instruction", "")) for t in evaluation}
    judge_keys = {judge_key(t) for t in evaluation}
    full = [t["id"] for t in generated if content_key(t) in content]
    exact = [t["id"] for t in generated if normalise_instruction(t.get("instruction", "")) in instructions]
    reuse = [t["id"] for t in generated if judge_key(t) in judge_keys]
    if n:
        ours = np.asarray(embed([t.get("instruction", "") for t in generated]), np.float32)
        theirs = np.asarray(embed([t.get("instruction", "") for t in evaluation]), np.float32)
        best = np.asarray(_max_similarity(ours, theirs))
    else:
        best = np.zeros((0,), np.float32)
    near = [t["id"] for t, s in zip(generated, best) if s >= threshold]

    def rate(ids: list[str]) -> dict[str, Any]:
        return {"count": len(ids), "rate": len(ids) / n if n else 0.0, "ids": ids}

    return {
        "generated": n,
        "evaluation_pool": len(evaluation),
        "threshold": threshold,
        "full_json_duplicates": rate(full),
        "instruction_exact_duplicates": rate(exact),
        "objective_near_duplicates": rate(near),
        "judge_exact_reuse": rate(reuse),
        "similarity_p50": float(np.percentile(best, 50)) if n else None,
        "similarity_p95": float(np.percentile(best, 95)) if n else None,
    }


def format_audit(name: str, audit: dict[str, Any]) -> str:
    """One Table 8 row."""

    def cell(key: str) -> str:
        return f"{100 * audit[key]['rate']:.2f}% ({audit[key]['count']})"

    p50, p95 = audit["similarity_p50"], audit["similarity_p95"]
    sims = "-" if p50 is None else f"{p50:.3f} / {p95:.3f}"
    return (
        "subset | N | full JSON dup. | instruction exact dup. | objective near-dup. | judge exact reuse | sim p50/p95\n"
        f"{name} | {audit['generated']} | {cell('full_json_duplicates')} | {cell('instruction_exact_duplicates')} | "
        f"{cell('objective_near_duplicates')} | {cell('judge_exact_reuse')} | {sims}"
    )
