"""The project's tokenizer and image processor: a tiny Qwen3-VL-compatible pair built locally.

Nothing can be downloaded where cua_jax runs its tests, so the repository ships a small
byte-level BPE tokenizer (`assets/qwen_tiny_tokenizer/`) laid out exactly like a Qwen3-VL
checkpoint's tokenizer files: the same pre-tokenizer, Qwen's special tokens (in Qwen's order,
after the BPE vocabulary), and a Qwen3-VL-style chat template that renders an image as
`<|vision_start|><|image_pad|><|vision_end|>`. Code that loads it through `load_tokenizer`
works unchanged on a real Qwen3-VL tokenizer directory.

The shipped files are rebuilt byte for byte by `build_tokenizer(out_dir)` from the shipped
training corpus (`assets/tokenizer_corpus.txt.gz`); `assemble_corpus()` regenerates that corpus
from the Python standard library's docstrings, the MiniWoB task pages of the `miniwob` package
and the computer-use action vocabulary. Rebuild everything with

    python -m cua_jax.context.tokenizer --corpus-from-sources

The image processor is transformers' `Qwen2VLImageProcessorPil` (the PIL backend; Qwen3-VL
uses the same class with patch 16) configured for small screenshots: a 160x210 MiniWoB page
becomes a 14x10 patch grid, i.e. 35 merged image tokens.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import inspect
import io
import json
import os
import pathlib
import shutil
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ASSETS_DIR = pathlib.Path(__file__).resolve().parent / "assets"
SHIPPED_TOKENIZER_DIR = ASSETS_DIR / "qwen_tiny_tokenizer"
SHIPPED_CORPUS = ASSETS_DIR / "tokenizer_corpus.txt.gz"

# Total vocabulary (BPE tokens + special tokens); a multiple of 64 keeps embedding shards even.
VOCAB_SIZE = 4096

# Qwen3-VL's added tokens in Qwen's id order (151643...151668 in the real vocabulary); `special`
# says whether decoding with skip_special_tokens drops it (Qwen marks the tool/think tags non-special).
QWEN_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

# Qwen2/Qwen3's pre-tokenizer split (contractions, letters, single digits, punctuation runs, newlines).
QWEN_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501 (kept whole to compare with upstream)

# Renders like Qwen3-VL-Instruct's chat template: ChatML turns, images and videos as one
# vision_start/pad/vision_end triple each (the processor expands the pad to the merged patch
# count), tool calls and tool responses in Qwen's XML tags.
QWEN_VL_CHAT_TEMPLATE = r"""{%- macro render_content(content, allow_vision) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for item in content -%}
            {%- if item.type == 'image' or 'image' in item or 'image_url' in item -%}
                {%- if not allow_vision -%}
                    {{- raise_exception('System messages cannot contain images.') -}}
                {%- endif -%}
                {%- set image_count.value = image_count.value + 1 -%}
                {%- if add_vision_id -%}{{- 'Picture ' ~ image_count.value ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif item.type == 'video' or 'video' in item -%}
                {%- if not allow_vision -%}
                    {{- raise_exception('System messages cannot contain videos.') -}}
                {%- endif -%}
                {%- set video_count.value = video_count.value + 1 -%}
                {%- if add_vision_id -%}{{- 'Video ' ~ video_count.value ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif 'text' in item -%}
                {{- item.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- set image_count = namespace(value=0) -%}
{%- set video_count = namespace(value=0) -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0].role == 'system' -%}
        {{- render_content(messages[0].content, false) + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\n' + render_content(messages[0].content, false) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {{- '<|im_start|>user\n' + render_content(message.content, true) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' + render_content(message.content, false) -}}
        {%- if message.tool_calls -%}
            {%- for tool_call in message.tool_calls -%}
                {%- if (loop.first and message.content) or (not loop.first) -%}{{- '\n' -}}{%- endif -%}
                {%- if tool_call.function -%}{%- set tool_call = tool_call.function -%}{%- endif -%}
                {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' -}}
                {%- if tool_call.arguments is string -%}
                    {{- tool_call.arguments -}}
                {%- else -%}
                    {{- tool_call.arguments | tojson -}}
                {%- endif -%}
                {{- '}\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + render_content(message.content, true) + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""  # noqa: E501 (Qwen's system-prompt lines kept whole to compare with upstream)

# Image-processor settings: Qwen3-VL's patch geometry, pixel bounds sized for small screenshots
# (at most 256 merged tokens per image; a 160x210 MiniWoB page gives 35).
PATCH_SIZE = 16
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
MIN_PIXELS = 4 * (PATCH_SIZE * MERGE_SIZE) ** 2
MAX_PIXELS = 256 * (PATCH_SIZE * MERGE_SIZE) ** 2

# Modules whose docstrings give the corpus ordinary English and programming prose.
_CORPUS_STDLIB_MODULES = (
    "argparse", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "difflib", "email.message", "enum", "fractions", "functools",
    "glob", "heapq", "html", "http.client", "inspect", "io", "itertools", "json", "logging",
    "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "shutil", "socket",
    "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "time", "typing", "unittest", "urllib.parse", "uuid", "zipfile",
)  # fmt: skip

# The computer-use action vocabulary (ScaleCUA App. A plus MiniWoB/browser verbs).
_ACTION_WORDS = (
    "left_click right_click middle_click double_click triple_click left_click_drag mouse_move "
    "left_mouse_down left_mouse_up key hold_key type scroll screenshot wait cursor_position "
    "done answer write_file click drag hotkey press FAIL DONE WAIT up down left right "
    "ctrl alt shift enter tab escape backspace delete home end pageup pagedown space "
    "ctrl+c ctrl+v ctrl+s ctrl+a ctrl+z alt+tab coordinate text amount direction duration"
).split()


def assemble_corpus() -> str:
    """Collect the tokenizer's training text from sources installed with the project.

    Deterministic for a given Python and `miniwob` version; the result is shipped as
    `assets/tokenizer_corpus.txt.gz` so the tokenizer does not depend on either.
    """
    parts: list[str] = []
    for module_name in _CORPUS_STDLIB_MODULES:
        module = importlib.import_module(module_name)
        parts.append(inspect.getdoc(module) or "")
        for name in sorted(vars(module)):
            member = getattr(module, name)
            if name.startswith("_") or getattr(member, "__module__", None) != module.__name__:
                continue
            parts.append(inspect.getdoc(member) or "")

    import miniwob  # the MiniWoB++ task pages: HTML, task utterances, page JavaScript

    pages = pathlib.Path(miniwob.__file__).parent / "html" / "miniwob"
    for page in sorted(pages.glob("*.html")):
        parts.append(page.read_text(encoding="utf-8", errors="replace"))

    for word in _ACTION_WORDS:
        parts.append(
            f"{word}\n{word}(x=512, y=384)\n<tool_call>\n"
            + json.dumps({"name": "computer_use", "arguments": {"action": word}})
            + "\n</tool_call>"
        )
    for value in range(0, 1001, 7):  # coordinates on the 1000x1000 grid
        parts.append(f"click(x={value}, y={1000 - value}) ({value}, {1000 - value})")
    return "\n\n".join(p for p in parts if p.strip())


def write_corpus(text: str, path: pathlib.Path = SHIPPED_CORPUS) -> None:
    """Write the corpus gzipped with a zero timestamp, so equal text gives equal bytes."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as f:
        f.write(text.encode("utf-8"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())


def read_corpus(path: pathlib.Path = SHIPPED_CORPUS) -> str:
    return gzip.decompress(path.read_bytes()).decode("utf-8")


def train_bpe(corpus: str, vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train a Qwen-layout byte-level BPE on `corpus`: `vocab_size - 26` BPE tokens, then Qwen's added tokens."""
    num_bpe = vocab_size - len(QWEN_ADDED_TOKENS)
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=num_bpe,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # Sequences of 16 lines, in order (blank lines included, so runs of newlines get merged as
    # in Qwen's vocabulary); the trainer's counts, hence its merges, are deterministic.
    lines = corpus.split("\n")
    chunks = ["\n".join(lines[i : i + 16]) for i in range(0, len(lines), 16)]
    tokenizer.train_from_iterator(chunks, trainer=trainer)
    if tokenizer.get_vocab_size() != num_bpe:
        raise ValueError(f"BPE training gave {tokenizer.get_vocab_size()} tokens, wanted {num_bpe}: corpus too small")
    for content, special in QWEN_ADDED_TOKENS:
        tokenizer.add_tokens([_added_token(content, special)])
    return tokenizer


def _added_token(content: str, special: bool):
    from tokenizers import AddedToken

    return AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)


def build_tokenizer(
    out_dir: str | os.PathLike, corpus: str | None = None, vocab_size: int = VOCAB_SIZE
) -> pathlib.Path:
    """Train the tiny tokenizer (on the shipped corpus by default) and write it as a HF tokenizer directory.

    Writes tokenizer.json, tokenizer_config.json, special_tokens_map.json and chat_template.jinja
    in the layout of a Qwen3-VL checkpoint. Deterministic: the same corpus gives the same bytes.
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_bpe(read_corpus() if corpus is None else corpus, vocab_size)
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)

    added_tokens_decoder = {
        str(tokenizer.token_to_id(content)): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for content, special in QWEN_ADDED_TOKENS
    }
    special = [content for content, is_special in QWEN_ADDED_TOKENS if is_special]
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": special[1:],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(
        out / "special_tokens_map.json",
        {"additional_special_tokens": special[1:], "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )
    (out / "chat_template.jinja").write_text(QWEN_VL_CHAT_TEMPLATE, encoding="utf-8")
    return out


def _write_json(path: pathlib.Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def load_tokenizer(path: str | os.PathLike | None = None):
    """Load a tokenizer directory with transformers: the shipped tiny one by default, or a real Qwen3-VL one.

    The chat template comes from the tokenizer files (chat_template.jinja / tokenizer_config.json)
    or, failing those, from the processor's chat_template.json. Returns a `PreTrainedTokenizerFast`
    (transformers' tokenizers backend) with the chat template attached. Special token ids come from
    the tokenizer, e.g. `tok.convert_tokens_to_ids("<|image_pad|>")` or `special_token_ids(tok)`.
    """
    from transformers import AutoTokenizer

    directory = pathlib.Path(path) if path is not None else SHIPPED_TOKENIZER_DIR
    if not (directory / "tokenizer.json").is_file() and not (directory / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"no tokenizer files (tokenizer.json / tokenizer_config.json) in {directory}")
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    processor_template = directory / "chat_template.json"  # where Qwen3-VL checkpoints keep the processor's template
    if not tokenizer.chat_template and processor_template.is_file():
        tokenizer.chat_template = json.loads(processor_template.read_text(encoding="utf-8"))["chat_template"]
    if not tokenizer.chat_template:
        raise ValueError(
            f"the tokenizer in {directory} has no chat template (chat_template.jinja or tokenizer_config.json)"
        )
    return tokenizer


def shipped_special_token_ids() -> dict[str, int]:
    """Ids of Qwen's added tokens in the shipped tiny tokenizer, without loading it: they
    follow its BPE vocabulary in order (`train_bpe`)."""
    first = VOCAB_SIZE - len(QWEN_ADDED_TOKENS)
    return {content: first + i for i, (content, _) in enumerate(QWEN_ADDED_TOKENS)}


def shipped_image_token_ids() -> dict[str, int]:
    """A vision-language config's special token ids (image_token_id, video_token_id,
    vision_start_token_id, vision_end_token_id) in the shipped tiny tokenizer."""
    ids = shipped_special_token_ids()
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }


def special_token_ids(tokenizer) -> dict[str, int]:
    """The ids of Qwen's added tokens that `tokenizer` knows, by token text (read from the tokenizer)."""
    vocab = tokenizer.get_vocab()
    return {content: vocab[content] for content, _ in QWEN_ADDED_TOKENS if content in vocab}


def build_image_processor(
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
    patch_size: int = PATCH_SIZE,
    merge_size: int = MERGE_SIZE,
    temporal_patch_size: int = TEMPORAL_PATCH_SIZE,
):
    """Construct transformers' `Qwen2VLImageProcessorPil` with Qwen3-VL's geometry and small-screen pixel bounds."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
        image_mean=[0.5, 0.5, 0.5],  # Qwen3-VL normalises to [-1, 1]
        image_std=[0.5, 0.5, 0.5],
    )


def load_image_processor(path: str | os.PathLike | None = None):
    """The image processor saved in `path` (preprocessor_config.json, e.g. a Qwen3-VL checkpoint), built
    with the PIL backend; the default small-screen one when `path` is None or holds no such file."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if path is None or not (pathlib.Path(path) / "preprocessor_config.json").is_file():
        return build_image_processor()
    return Qwen2VLImageProcessorPil.from_pretrained(str(path))


def load_processor(path: str | os.PathLike | None = None):
    """(tokenizer, image_processor) from one directory: the shipped tokenizer and default processor by
    default, or a model directory holding both (as `save_tokenizer_and_processor` or Qwen3-VL writes it)."""
    return load_tokenizer(path), load_image_processor(path)


# The files of a HF model directory that make up its tokenizer (with the chat template) and its
# image processor; `save_tokenizer_and_processor` copies these from a source directory.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json")


def save_tokenizer_and_processor(
    out_dir: str | os.PathLike, tokenizer=None, image_processor=None, *, chat_template: str | None = None
) -> pathlib.Path:
    """Write tokenizer files, chat template and preprocessor_config.json into `out_dir` (a HF model directory),
    so that `load_processor(out_dir)` gives back the same tokenizer, chat template and image processor.

    tokenizer: a transformers tokenizer (written with its `save_pretrained`), or a directory whose
      tokenizer files (`TOKENIZER_FILES`) are copied byte for byte; default the shipped tokenizer's directory.
    image_processor: written with its `save_pretrained`; default the one `load_image_processor` finds for
      the tokenizer: a directory's processor files (`PROCESSOR_FILES`) copied byte for byte, else
      `build_image_processor()`.
    chat_template: replaces the tokenizer's chat template (and the processor's chat_template.json, when
      one was copied).
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = None
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        source = pathlib.Path(tokenizer) if tokenizer is not None else SHIPPED_TOKENIZER_DIR
        if not (source / "tokenizer.json").is_file() and not (source / "tokenizer_config.json").is_file():
            raise FileNotFoundError(f"no tokenizer files (tokenizer.json / tokenizer_config.json) in {source}")
        _replace_files(source, out, TOKENIZER_FILES)
    else:
        _remove_files(out, TOKENIZER_FILES)
        tokenizer.save_pretrained(str(out))
    if chat_template is not None:
        from transformers import AutoTokenizer

        # Through transformers, so every file that carries a template agrees with the new one.
        written = AutoTokenizer.from_pretrained(str(out))
        written.chat_template = chat_template
        written.save_pretrained(str(out))
        if (out / "chat_template.json").is_file():
            _write_json(out / "chat_template.json", {"chat_template": chat_template})
    if image_processor is None and source is not None and (source / "preprocessor_config.json").is_file():
        _replace_files(source, out, PROCESSOR_FILES)
    else:
        _remove_files(out, PROCESSOR_FILES)
        (image_processor if image_processor is not None else build_image_processor()).save_pretrained(str(out))
    return out


def _remove_files(directory: pathlib.Path, names: tuple[str, ...]) -> None:
    """Deletes `names` from `directory`: a file left by an earlier export (an old chat_template.jinja
    outranks the template in tokenizer_config.json) must not change what loads from it."""
    for name in names:
        (directory / name).unlink(missing_ok=True)


def _replace_files(source: pathlib.Path, out: pathlib.Path, names: tuple[str, ...]) -> None:
    """`out`'s files among `names` become exactly `source`'s (copied byte for byte)."""
    if source.resolve() == out.resolve():
        return
    _remove_files(out, names)
    for name in names:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)


def pixel_bounds(image_processor) -> tuple[int, int]:
    """(min_pixels, max_pixels) an image is resized within, from the processor's `size`."""
    size = image_processor.size
    min_pixels = size["shortest_edge"] if "shortest_edge" in size else size["min_pixels"]
    max_pixels = size["longest_edge"] if "longest_edge" in size else size["max_pixels"]
    return int(min_pixels), int(max_pixels)


def merged_token_count(grid_thw: tuple[int, int, int], merge_size: int) -> int:
    """Image-pad tokens for a patch grid (t, h, w): t * h * w / merge_size**2 (the merger folds 2x2 patches)."""
    t, h, w = grid_thw
    return (t * h * w) // (merge_size * merge_size)


def image_grid_thw(image_processor, height: int, width: int) -> tuple[int, int, int]:
    """The processor's patch grid (1, h, w) for an image of `height` x `width`, without touching pixels.

    Uses the processor's own `smart_resize` and settings, so it equals `image_grid_thw` from
    `image_processor(images=...)` (a test checks this).
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    factor = image_processor.patch_size * image_processor.merge_size
    min_pixels, max_pixels = pixel_bounds(image_processor)
    resized_h, resized_w = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    return (1, resized_h // image_processor.patch_size, resized_w // image_processor.patch_size)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Rebuild the shipped tiny Qwen-layout tokenizer.")
    parser.add_argument("--out", default=str(SHIPPED_TOKENIZER_DIR))
    parser.add_argument("--corpus-from-sources", action="store_true", help="re-assemble the shipped corpus first")
    args = parser.parse_args(argv)
    if args.corpus_from_sources:
        write_corpus(assemble_corpus())
    out = pathlib.Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    build_tokenizer(out)
    print(f"wrote {out} ({VOCAB_SIZE} tokens)")


if __name__ == "__main__":
    main()
