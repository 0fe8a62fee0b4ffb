"""The shipped tiny tokenizer and the image processor: reproducible, Qwen-shaped, loadable from a directory."""

import json
import shutil
import unicodedata

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from cua_jax.context import tokenizer as tk


def test_rebuilding_the_shipped_tokenizer_gives_identical_files(tmp_path):
    tk.build_tokenizer(tmp_path)
    shipped = sorted(p.name for p in tk.SHIPPED_TOKENIZER_DIR.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == shipped
    for name in shipped:
        assert (tmp_path / name).read_bytes() == (tk.SHIPPED_TOKENIZER_DIR / name).read_bytes(), name


def test_shipped_tokenizer_has_qwens_special_tokens_after_the_bpe_vocabulary(tokenizer_and_processor):
    tokenizer, _ = tokenizer_and_processor
    assert len(tokenizer) == tk.VOCAB_SIZE
    ids = tk.special_token_ids(tokenizer)
    first = tk.VOCAB_SIZE - len(tk.QWEN_ADDED_TOKENS)
    assert ids == {token: first + i for i, (token, _) in enumerate(tk.QWEN_ADDED_TOKENS)}
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == ids["<|im_end|>"]
    assert tokenizer.pad_token_id == ids["<|endoftext|>"]
    # Each special token is one id, also when glued to text.
    encoded = tokenizer("a<|vision_start|><|image_pad|><|vision_end|>b<tool_call>", add_special_tokens=False)[
        "input_ids"
    ]
    assert ids["<|vision_start|>"] in encoded and ids["<|image_pad|>"] in encoded and ids["<tool_call>"] in encoded


def test_chat_template_renders_chatml_with_vision_placeholders(tokenizer_and_processor):
    tokenizer, _ = tokenizer_and_processor
    messages = [
        {"role": "system", "content": "Act."},
        {"role": "user", "content": [{"type": "text", "text": "Click OK."}, {"type": "image"}]},
        {"role": "assistant", "content": "done"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nAct.<|im_end|>\n<|im_start|>user\nClick OK.<|vision_start|><|image_pad|><|vision_end|>"
        "<|im_end|>\n<|im_start|>assistant\ndone<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(Exception, match="System messages cannot contain images"):
        tokenizer.apply_chat_template([{"role": "system", "content": [{"type": "image"}]}], tokenize=False)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_text_round_trips_through_the_byte_level_bpe(tokenizer_and_processor, text):
    tokenizer, _ = tokenizer_and_processor
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # NFC is the tokenizer's normaliser (as in Qwen's), so the round trip is up to NFC.
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


@settings(max_examples=25, deadline=None)
@given(st.integers(8, 700), st.integers(8, 700))
def test_image_grid_matches_the_processors_own_output(tokenizer_and_processor, height, width):
    _, image_processor = tokenizer_and_processor
    out = image_processor(images=[np.zeros((height, width, 3), np.uint8)])
    grid = tk.image_grid_thw(image_processor, height, width)
    assert tuple(int(v) for v in out["image_grid_thw"][0]) == grid
    assert out["pixel_values"].shape[0] == grid[0] * grid[1] * grid[2]
    tokens = tk.merged_token_count(grid, image_processor.merge_size)
    assert tk.MIN_PIXELS // (32 * 32) <= tokens <= tk.MAX_PIXELS // (32 * 32)


def test_miniwob_screenshot_gives_a_modest_token_count(tokenizer_and_processor):
    _, image_processor = tokenizer_and_processor
    assert (
        image_processor.patch_size == 16
        and image_processor.merge_size == 2
        and image_processor.temporal_patch_size == 2
    )
    assert tk.image_grid_thw(image_processor, 210, 160) == (1, 14, 10)  # 35 merged tokens


def test_saved_model_directory_loads_back_the_same_tokenizer_and_processor(tmp_path, tokenizer_and_processor):
    tokenizer, image_processor = tokenizer_and_processor
    tk.save_tokenizer_and_processor(tmp_path)
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json"} <= {
        p.name for p in tmp_path.iterdir()
    }
    loaded_tokenizer, loaded_processor = tk.load_processor(tmp_path)
    assert tk.special_token_ids(loaded_tokenizer) == tk.special_token_ids(tokenizer)
    text = "Click on the <|vision_start|><|image_pad|><|vision_end|> submit button."
    assert loaded_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    assert type(loaded_processor) is type(image_processor)
    for shape in [(210, 160), (800, 1280), (33, 999)]:
        assert tk.image_grid_thw(loaded_processor, *shape) == tk.image_grid_thw(image_processor, *shape)

    # Re-saving the loaded pair (as an exporter given explicit objects does) keeps them loadable.
    resaved = tmp_path / "resaved"
    tk.save_tokenizer_and_processor(resaved, loaded_tokenizer, loaded_processor)
    again_tokenizer, again_processor = tk.load_processor(resaved)
    assert again_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert tk.image_grid_thw(again_processor, 210, 160) == (1, 14, 10)


def test_loading_a_directory_without_tokenizer_files_names_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        tk.load_tokenizer(tmp_path)


def test_chat_template_is_read_from_the_processors_chat_template_json(tmp_path, tokenizer_and_processor):
    """Qwen3-VL checkpoints may keep the template only in the processor's chat_template.json."""
    tokenizer, _ = tokenizer_and_processor
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(tk.SHIPPED_TOKENIZER_DIR / name, tmp_path / name)
    with pytest.raises(ValueError, match="has no chat template"):
        tk.load_tokenizer(tmp_path)
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": tk.QWEN_VL_CHAT_TEMPLATE}))
    assert tk.load_tokenizer(tmp_path).chat_template == tokenizer.chat_template
