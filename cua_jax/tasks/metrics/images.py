"""Image metrics (OSWorld's gimp.py image checks and vlc.py's compare_images) on Pillow and
numpy. By OSWorld's convention the first image is the agent's (src) and the second the
reference (tgt)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from cua_jax.tasks.metrics.base import (
    JudgeError,
    clamp01,
    load_expected,
    load_result,
    metric,
    result_file,
    rule,
)
from cua_jax.tasks.metrics.measures import laplacian_variance, structural_similarity


def _open(path: str):
    from PIL import Image

    image = Image.open(path)
    image.load()
    return image


def result_image(path: Any):
    """The agent's image, or None when missing or unreadable."""
    return load_result(_open, path, "image")


def expected_image(path: Any):
    return load_expected(_open, path, "reference image")


def ssim_of_images(first, second) -> float | None:
    """SSIM of two equally sized images as RGB (7x7 window, smaller for images under 7
    pixels a side); None when the sizes differ or an image is under 7 pixels a side."""
    if min(first.size) < 7 or min(second.size) < 7 or first.size != second.size:
        return None
    a, b = np.asarray(first.convert("RGB")), np.asarray(second.convert("RGB"))
    return structural_similarity(a, b, data_range=255.0, win_size=7)


def similar_by_ssim(first, second, threshold: float = 0.9) -> bool:
    """OSWorld's structure check: SSIM (as RGB) at least `threshold`, sizes equal."""
    value = ssim_of_images(first, second)
    return value is not None and value >= threshold


def similar_by_mse(first, second, threshold: float = 0.03) -> bool:
    """Mean squared difference of the [0, 1]-scaled RGB pixels below `threshold`, the first
    image resized (Lanczos) to the second's size."""
    from PIL import Image

    if first.size != second.size:
        first = first.resize(second.size, Image.Resampling.LANCZOS)
    a = np.asarray(first.convert("RGB"), dtype=np.float32) / 255
    b = np.asarray(second.convert("RGB"), dtype=np.float32) / 255
    return float(np.mean((a - b) ** 2)) < threshold


def mean_brightness(image) -> float:
    return float(np.asarray(image.convert("L"), dtype=np.float64).mean())


def mean_saturation(image) -> float:
    return float(np.asarray(image.convert("RGB").convert("HSV"), dtype=np.float64)[..., 1].mean())


def contrast(image) -> float:
    """The standard deviation of all pixel values of the image as stored."""
    return float(np.asarray(image, dtype=np.float32).std())


def _pair(src_path: Any, tgt_path: Any):
    """(agent's image, reference image); the first is None when the agent's is missing."""
    reference = expected_image(tgt_path)
    return result_image(src_path), reference


@metric()
def compare_images(
    image1_path: str | None, image2_path: str | None, reference_base_result: float | None = None, **_
) -> float:
    """The SSIM of two images in grayscale, both resized (Lanczos) to the smaller size (the
    lesser (width, height) pair); with reference_base_result b, rescaled as
    (s - b) / (1 - b) and 0 below b + 0.01. Negative similarities score 0."""
    from PIL import Image

    second = expected_image(image2_path)
    first = result_image(image1_path)
    if first is None:
        return 0.0
    size = min(first.size, second.size)
    a = np.asarray(first.convert("L").resize(size, Image.Resampling.LANCZOS))
    b = np.asarray(second.convert("L").resize(size, Image.Resampling.LANCZOS))
    if min(a.shape) < 7:
        return 0.0
    similarity = structural_similarity(a, b, data_range=255.0, win_size=7)
    if reference_base_result is None:
        return clamp01(similarity)
    if similarity >= reference_base_result + 0.01:
        return clamp01((similarity - reference_base_result) / (1 - reference_base_result))
    return 0.0


@metric()
def compare_image_list(result_paths: str | list | None, expected_paths: str | list) -> float:
    """1 when each image equals its reference pixel for pixel (after resizing it to the
    reference's size and mode)."""
    from PIL import Image, ImageChops

    if not isinstance(expected_paths, list):
        result_paths, expected_paths = [result_paths], [expected_paths]
    if not isinstance(result_paths, list) or len(result_paths) != len(expected_paths):
        return 0.0
    for result_path, expected_path in zip(result_paths, expected_paths):
        reference = expected_image(expected_path)
        image = result_image(result_path)
        if image is None:
            return 0.0
        if image.size != reference.size:
            image = image.resize(reference.size, Image.Resampling.LANCZOS)
        if image.mode != reference.mode:
            image = image.convert(reference.mode)
        if ImageChops.difference(image, reference).getbbox():
            return 0.0
    return 1.0


@metric()
def check_structure_sim(src_path: str | None, tgt_path: str | None) -> float:
    """1 when the images have the same size and SSIM at least 0.9."""
    image, reference = _pair(src_path, tgt_path)
    return float(image is not None and similar_by_ssim(image, reference))


@metric()
def check_structure_sim_resized(src_path: str | None, tgt_path: str | None) -> float:
    """1 when the image (cropped to its opaque part when it has transparency), resized to the
    reference's size, has SSIM at least 0.9 with it."""
    image, reference = _pair(src_path, tgt_path)
    if image is None:
        return 0.0
    if image.mode in ("RGBA", "LA") or "transparency" in image.info:
        image = image.convert("RGBA")
        box = image.split()[-1].getbbox()
        if box is None:
            return 0.0
        image = image.crop(box).convert("RGB")
    return float(similar_by_ssim(image.resize(reference.size), reference.convert("RGB")))


@metric()
def check_structure_sim_with_threshold(
    src_path: str | None, tgt_path: str | None, ssim_threshold: float = 0.85, **_
) -> float:
    """1 when the image, resized (Lanczos) to the reference's size, has SSIM at least
    `ssim_threshold` with it (window shrunk to the image for images under 7 pixels)."""
    from PIL import Image

    image, reference = _pair(src_path, tgt_path)
    if image is None:
        return 0.0
    if image.size != reference.size:
        image = image.resize(reference.size, Image.Resampling.LANCZOS)
    a, b = np.asarray(image.convert("RGB")), np.asarray(reference.convert("RGB"))
    smallest = min(a.shape[:2])
    window = 7 if smallest >= 7 else (smallest if smallest % 2 else smallest - 1)
    if window < 1:
        return 0.0
    return float(structural_similarity(a, b, data_range=255.0, win_size=window) >= ssim_threshold)


@metric()
def check_brightness_decrease_and_structure_sim(
    src_path: str | None, tgt_path: str | None, threshold: float = 0.03
) -> float:
    """1 when the image is darker than the reference and, both brought to mean brightness
    128, their mean squared difference is below `threshold`."""
    image, reference = _pair(src_path, tgt_path)
    if image is None:
        return 0.0
    darker = mean_brightness(image) < mean_brightness(reference)

    def normalised(picture):
        current = mean_brightness(picture)
        factor = 128 / current if current else 0.0
        return picture.point(lambda x: min(255, max(0, int(x * factor))))

    return float(darker and similar_by_mse(normalised(image), normalised(reference), threshold))


@metric()
def check_saturation_increase_and_structure_sim(src_path: str | None, tgt_path: str | None) -> float:
    """1 when the image is more saturated than the reference and their hue and value
    channels each have SSIM at least 0.9."""
    image, reference = _pair(src_path, tgt_path)
    if image is None:
        return 0.0
    hsv1, hsv2 = image.convert("RGB").convert("HSV"), reference.convert("RGB").convert("HSV")
    more = mean_saturation(image) > mean_saturation(reference)
    h1, _, v1 = hsv1.split()
    h2, _, v2 = hsv2.split()
    return float(more and similar_by_ssim(h1, h2) and similar_by_ssim(v1, v2))


@metric()
def check_contrast_increase_and_structure_sim(src_path: str | None, tgt_path: str | None) -> float:
    """1 when the image has more contrast (pixel standard deviation) than the reference and
    SSIM at least 0.65 with it."""
    image, reference = _pair(src_path, tgt_path)
    if image is None:
        return 0.0
    return float(contrast(image) > contrast(reference) and similar_by_ssim(image, reference, 0.65))


@metric()
def check_file_exists_and_structure_sim(src_path: str | None, tgt_path: str | None) -> float:
    """1 when the exported image exists, has the reference's size and SSIM at least 0.9."""
    return check_structure_sim(src_path, tgt_path)


@metric()
def check_palette_and_structure_sim(src_path: str | None, tgt_path: str | None) -> float:
    """1 when the image is palette-based (mode P) and, as RGB, has SSIM at least 0.9 with the
    reference."""
    image, reference = _pair(src_path, tgt_path)
    return float(image is not None and image.mode == "P" and similar_by_ssim(image.convert("RGB"), reference))


@metric()
def check_image_mirror(src_path: str | None, tgt_path: str | None) -> float:
    """1 when the image mirrored left to right has SSIM at least 0.99 with the reference."""
    from PIL import Image

    image, reference = _pair(src_path, tgt_path)
    return float(
        image is not None and similar_by_ssim(image.transpose(Image.Transpose.FLIP_LEFT_RIGHT), reference, 0.99)
    )


@metric()
def check_green_background(src_path: str | None, tgt_path: str | None) -> float:
    """1 when every pixel that is not black in the reference is green in the image (its
    green channel above red and blue)."""
    image, reference = _pair(src_path, tgt_path)
    if image is None or image.size != reference.size:
        return 0.0
    pixels = np.asarray(image.convert("RGB"), dtype=np.int32)
    background = np.any(np.asarray(reference.convert("RGB")) != 0, axis=2)
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    return float(bool(np.all(((g > r) & (g > b))[background])))


@metric()
def check_sharper(src_path: str | None, tgt_path: str | None) -> float:
    """1 when the image is sharper (higher variance of its grayscale Laplacian) than the
    reference."""
    image, reference = _pair(src_path, tgt_path)
    if image is None or min(image.size) < 2:
        return 0.0
    return float(
        laplacian_variance(np.asarray(image.convert("L"))) > laplacian_variance(np.asarray(reference.convert("L")))
    )


@metric()
def increase_saturation(image1_path: str | None, image2_path: str | None) -> float:
    """1 when the second image is more saturated than the first."""
    second = expected_image(image2_path)
    first = result_image(image1_path)
    return float(first is not None and mean_saturation(first) < mean_saturation(second))


@metric()
def decrease_brightness(image1_path: str | None, image2_path: str | None) -> float:
    """1 when the second image is darker than the first."""
    second = expected_image(image2_path)
    first = result_image(image1_path)
    return float(first is not None and mean_brightness(first) > mean_brightness(second))


@metric()
def check_image_size(src_path: str | None, rules: dict) -> float:
    """1 when the image is rules['width'] wide and / or rules['height'] high. Its opaque
    part is measured instead when rules['ignore_transparent'] is set and it has an alpha
    channel, or whenever it has a transparent palette colour (OSWorld's precedence)."""
    if not isinstance(rules, dict):
        raise JudgeError(f"check_image_size needs rules with width / height, got {rules!r}")
    image = result_image(src_path)
    if image is None:
        return 0.0
    if (rules.get("ignore_transparent", False) and image.mode in ("RGBA", "LA")) or "transparency" in image.info:
        box = image.convert("RGBA").split()[-1].getbbox()
        width, height = (0, 0) if box is None else (box[2] - box[0], box[3] - box[1])
    else:
        width, height = image.size
    return float(
        (rules.get("height") is None or height == rules["height"])
        and (rules.get("width") is None or width == rules["width"])
    )


@metric()
def check_image_file_size(src_path: str | None, rules: dict) -> float:
    """1 when the file is smaller than rules['max_size'] bytes."""
    limit = rule(rules, "max_size")
    local = result_file(src_path)
    return float(local is not None and os.path.getsize(local) < limit)


@metric(arity=1)
def check_triangle_position(tgt_path: str | None) -> float:
    """1 when the pixels of the colour OSWorld picks (the second in ascending order of pixel
    count) have their centroid within 5% of the image size from its centre."""
    image = result_image(tgt_path)
    if image is None:
        return 0.0
    pixels = np.asarray(image)
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    colours, counts = np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0, return_counts=True)
    if len(colours) < 2:
        return 0.0
    triangle = colours[np.argsort(counts, kind="stable")][1]
    centroid = np.argwhere(np.all(pixels == triangle, axis=2)).mean(axis=0)
    shape = np.array(pixels.shape[:2], dtype=np.float64)
    return float(bool(np.all(np.abs(centroid - shape / 2) < 0.05 * shape)))


@metric(arity=1)
def check_textbox_on_leftside(src_path: str | None) -> float:
    """1 when the leftmost dark pixel (gray below 128) lies within the left 5% of the image."""
    image = result_image(src_path)
    if image is None:
        return 0.0
    dark = np.asarray(image.convert("L")) < 128
    columns = np.nonzero(dark.any(axis=0))[0]
    leftmost = columns[0] if len(columns) else image.size[0]
    return float(leftmost < image.size[0] * 0.05)
