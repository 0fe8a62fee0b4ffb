"""Hypothesis strategies for synthetic episodes: random screenshots sizes, texts and engine outputs."""

import hypothesis.strategies as st
import numpy as np

from cua_jax.types import Episode, Turn

# Observation text: letters, digits, punctuation, whitespace and some non-ASCII, never a special token.
observation_texts = st.text(alphabet=st.sampled_from(list("abcXYZ019 .,:;!?()[]{}<>|/\n\t-_'\"éß中")), max_size=30)


@st.composite
def engine_responses(draw, num_bpe: int, end_of_turn_id: int):
    """Token ids as an engine might sample them (not necessarily canonical BPE), and their logprobs."""
    length = draw(st.integers(1, 12))
    ids = draw(st.lists(st.integers(0, num_bpe - 1), min_size=length, max_size=length))
    if draw(st.booleans()):  # stopped on end-of-turn (usual) or cut by the token budget
        ids.append(end_of_turn_id)
    logprobs = draw(st.lists(st.floats(-20.0, 0.0, allow_nan=False, width=32), min_size=len(ids), max_size=len(ids)))
    return np.asarray(ids, np.int32), np.asarray(logprobs, np.float32)


@st.composite
def episodes(draw, num_bpe: int, end_of_turn_id: int, max_turns: int = 10, max_images_per_turn: int = 2):
    num_turns = draw(st.integers(1, max_turns))
    turns = []
    for _ in range(num_turns):
        shapes = draw(st.lists(st.tuples(st.integers(16, 120), st.integers(16, 120)), max_size=max_images_per_turn))
        ids, logprobs = draw(engine_responses(num_bpe, end_of_turn_id))
        turns.append(
            Turn(
                observation_text=draw(observation_texts),
                images=[np.zeros((h, w, 3), np.uint8) for h, w in shapes],
                response_ids=ids,
                response_logprobs=logprobs,
            )
        )
    return Episode(
        episode_id=f"episode-{draw(st.integers(0, 99))}",
        task_id="synthetic",
        group_id=draw(st.integers(0, 7)),
        instruction=draw(observation_texts),
        turns=turns,
        system_prompt=draw(st.sampled_from(["", "You operate a computer."])),
    )
