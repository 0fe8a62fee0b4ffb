"""Image metrics on images drawn with Pillow, and the numeric measures behind them checked
against direct numpy references and published values."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter

from cua_jax.tasks.metrics import JudgeError
from cua_jax.tasks.metrics import images as I
from cua_jax.tasks.metrics import measures as M


def scene(width=64, height=48):
    """A gradient with a few shapes: structure SSIM can see."""
    x = np.linspace(0, 255, width)[None, :, None]
    y = np.linspace(0, 255, height)[:, None, None]
    pixels = np.concatenate(
        [
            np.broadcast_to(x, (height, width, 1)),
            np.broadcast_to(y, (height, width, 1)),
            np.full((height, width, 1), 90.0),
        ],
        axis=2,
    ).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(image)
    draw.rectangle([8, 8, 24, 30], fill=(200, 40, 40))
    draw.ellipse([34, 12, 58, 40], fill=(30, 160, 70))
    return image


def save(image, path):
    image.save(path)
    return str(path)


# ---- measures --------------------------------------------------------------------------


def ssim_reference(a, b, data_range=255.0, win=7):
    """SSIM by explicit windows: the mean over every win x win window inside the image."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    values = []
    for i in range(a.shape[0] - win + 1):
        for j in range(a.shape[1] - win + 1):
            x, y = a[i : i + win, j : j + win].ravel(), b[i : i + win, j : j + win].ravel()
            mx, my = x.mean(), y.mean()
            vx, vy = x.var(ddof=1), y.var(ddof=1)
            cov = ((x - mx) * (y - my)).sum() / (x.size - 1)
            values.append(((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2)))
    return float(np.mean(values))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(7, 14), st.integers(7, 14))
def test_ssim_matches_explicit_windows_and_is_symmetric(seed, height, width):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (height, width))
    b = np.clip(a + rng.integers(-60, 60, (height, width)), 0, 255)
    value = M.structural_similarity(a, b)
    assert value == pytest.approx(ssim_reference(a, b), abs=1e-9)
    assert value == pytest.approx(M.structural_similarity(b, a), abs=1e-12)
    assert -1.0 <= value <= 1.0
    assert M.structural_similarity(a, a) == pytest.approx(1.0)


def test_ssim_channels_and_bad_shapes():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 256, (9, 9, 3)), rng.integers(0, 256, (9, 9, 3))
    per_channel = np.mean([M.structural_similarity(a[..., c], b[..., c]) for c in range(3)])
    assert M.structural_similarity(a, b) == pytest.approx(per_channel)
    with pytest.raises(ValueError, match="different shapes"):
        M.structural_similarity(a, b[:8])
    with pytest.raises(ValueError, match="exceeds the image"):
        M.structural_similarity(a[:5, :5, 0], b[:5, :5, 0])


# Sharma, Wu and Dalal (2005), "The CIEDE2000 color-difference formula": test pairs.
@pytest.mark.parametrize(
    "lab1, lab2, delta",
    [
        ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
        ((50.0, 3.1571, -77.2803), (50.0, 0.0, -82.7485), 2.8615),
        ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
        ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
        ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
        ((2.0776, 0.0795, -1.1350), (0.9033, -0.0636, -0.5514), 0.9082),
    ],
)
def test_ciede2000_reference_pairs(lab1, lab2, delta):
    assert M.ciede2000(lab1, lab2) == pytest.approx(delta, abs=1e-4)
    assert M.ciede2000(lab2, lab1) == pytest.approx(delta, abs=1e-4)


def test_srgb_to_lab_known_colours():
    assert M.srgb_to_lab([1, 0, 0]) == pytest.approx([53.2406, 80.0923, 67.2028], abs=1e-3)
    assert M.srgb_to_lab([1, 1, 1]) == pytest.approx([100, 0, 0], abs=1e-2)  # as scikit-image
    assert M.rgb_difference((255, 0, 0), (255, 0, 0)) == 0.0


def test_laplacian_variance_matches_convolution():
    rng = np.random.default_rng(1)
    g = rng.integers(0, 256, (6, 7)).astype(np.float64)
    padded = np.pad(g, 1, mode="reflect")
    lap = np.array(
        [
            [
                padded[i, j + 1]
                + padded[i + 2, j + 1]
                + padded[i + 1, j]
                + padded[i + 1, j + 2]
                - 4 * padded[i + 1, j + 1]
                for j in range(7)
            ]
            for i in range(6)
        ]
    )
    assert M.laplacian_variance(g) == pytest.approx(lap.var())
    assert M.laplacian_variance(np.full((5, 5), 7.0)) == 0.0


@given(st.tuples(*[st.integers(0, 255)] * 3), st.tuples(*[st.integers(0, 255)] * 3))
def test_normalised_rgb_distance_in_unit_range(a, b):
    d = M.normalised_rgb_distance(a, b)
    assert 0.0 <= d <= 1.0 and d == pytest.approx(M.normalised_rgb_distance(b, a))
    assert M.normalised_rgb_distance((0, 0, 0), (255, 255, 255)) == pytest.approx(1.0)


# ---- metrics --------------------------------------------------------------------------


def test_compare_images(tmp_path):
    reference = save(scene(), tmp_path / "ref.png")
    assert I.compare_images(save(scene(), tmp_path / "same.png"), reference) == pytest.approx(1.0)
    inverted = Image.eval(scene(), lambda v: 255 - v)
    assert I.compare_images(save(inverted, tmp_path / "inv.png"), reference) == 0.0
    noisy = Image.fromarray(np.clip(np.asarray(scene()).astype(int) + 25, 0, 255).astype(np.uint8))
    partial = I.compare_images(save(noisy, tmp_path / "noisy.png"), reference)
    assert 0.0 < partial < 1.0
    rescaled = I.compare_images(save(noisy, tmp_path / "noisy2.png"), reference, reference_base_result=0.5)
    assert rescaled == pytest.approx((partial - 0.5) / 0.5)
    assert I.compare_images(str(tmp_path / "absent.png"), reference) == 0.0
    with pytest.raises(JudgeError, match="missing"):
        I.compare_images(reference, str(tmp_path / "absent.png"))


def test_compare_image_list(tmp_path):
    a, b = save(scene(), tmp_path / "a.png"), save(scene(), tmp_path / "b.png")
    other = save(Image.eval(scene(), lambda v: 255 - v), tmp_path / "c.png")
    assert I.compare_image_list([a, b], [b, a]) == 1.0
    assert I.compare_image_list(a, b) == 1.0
    assert I.compare_image_list([a, other], [b, a]) == 0.0


def test_structure_similarity_checks(tmp_path):
    reference = save(scene(), tmp_path / "ref.png")
    different = save(Image.eval(scene(), lambda v: 255 - v), tmp_path / "diff.png")
    assert I.check_structure_sim(save(scene(), tmp_path / "s.png"), reference) == 1.0
    assert I.check_structure_sim(different, reference) == 0.0
    assert I.check_structure_sim(save(scene(66, 48), tmp_path / "w.png"), reference) == 0.0  # other size
    assert I.check_file_exists_and_structure_sim(save(scene(), tmp_path / "e.png"), reference) == 1.0
    assert I.check_file_exists_and_structure_sim(str(tmp_path / "absent.png"), reference) == 0.0
    big = save(scene().resize((128, 96)), tmp_path / "big.png")
    assert I.check_structure_sim_resized(big, reference) == 1.0
    assert I.check_structure_sim_resized(different, reference) == 0.0
    assert I.check_structure_sim_with_threshold(big, reference) == 1.0
    assert I.check_structure_sim_with_threshold(different, reference, ssim_threshold=0.5) == 0.0


def test_brightness_saturation_contrast_checks(tmp_path):
    reference = save(scene(), tmp_path / "ref.png")
    darker = save(ImageEnhance.Brightness(scene()).enhance(0.7), tmp_path / "dark.png")
    brighter = save(ImageEnhance.Brightness(scene()).enhance(1.3), tmp_path / "bright.png")
    assert I.check_brightness_decrease_and_structure_sim(darker, reference) == 1.0
    assert I.check_brightness_decrease_and_structure_sim(brighter, reference) == 0.0
    assert I.decrease_brightness(reference, darker) == 1.0
    assert I.decrease_brightness(reference, brighter) == 0.0
    saturated = save(ImageEnhance.Color(scene()).enhance(1.4), tmp_path / "sat.png")
    dull = save(ImageEnhance.Color(scene()).enhance(0.5), tmp_path / "dull.png")
    assert I.check_saturation_increase_and_structure_sim(saturated, reference) == 1.0
    assert I.check_saturation_increase_and_structure_sim(dull, reference) == 0.0
    assert I.increase_saturation(reference, saturated) == 1.0
    assert I.increase_saturation(reference, dull) == 0.0
    contrasty = save(ImageEnhance.Contrast(scene()).enhance(1.3), tmp_path / "c.png")
    flat = save(ImageEnhance.Contrast(scene()).enhance(0.7), tmp_path / "f.png")
    assert I.check_contrast_increase_and_structure_sim(contrasty, reference) == 1.0
    assert I.check_contrast_increase_and_structure_sim(flat, reference) == 0.0


def test_palette_mirror_sharpness(tmp_path):
    reference = save(scene(), tmp_path / "ref.png")
    assert (
        I.check_palette_and_structure_sim(
            save(scene().convert("P", palette=Image.Palette.ADAPTIVE, colors=256), tmp_path / "p.png"), reference
        )
        == 1.0
    )
    assert I.check_palette_and_structure_sim(save(scene(), tmp_path / "rgb.png"), reference) == 0.0
    mirrored = save(scene().transpose(Image.Transpose.FLIP_LEFT_RIGHT), tmp_path / "m.png")
    assert I.check_image_mirror(mirrored, reference) == 1.0
    assert I.check_image_mirror(reference, reference) == 0.0
    blurred = save(scene().filter(ImageFilter.GaussianBlur(2)), tmp_path / "blur.png")
    assert I.check_sharper(reference, blurred) == 1.0
    assert I.check_sharper(blurred, reference) == 0.0


def test_green_background(tmp_path):
    mask = Image.new("RGB", (20, 10), (0, 0, 0))
    ImageDraw.Draw(mask).rectangle([0, 0, 9, 9], fill=(255, 255, 255))  # left half is background
    mask_path = save(mask, tmp_path / "mask.png")
    green = Image.new("RGB", (20, 10), (200, 10, 10))
    ImageDraw.Draw(green).rectangle([0, 0, 9, 9], fill=(10, 200, 10))
    assert I.check_green_background(save(green, tmp_path / "g.png"), mask_path) == 1.0
    assert (
        I.check_green_background(save(Image.new("RGB", (20, 10), (200, 10, 10)), tmp_path / "r.png"), mask_path) == 0.0
    )


def test_size_and_file_size(tmp_path):
    path = save(scene(), tmp_path / "s.png")
    assert I.check_image_size(path, {"width": 64, "height": 48}) == 1.0
    assert I.check_image_size(path, {"width": 32}) == 0.0
    transparent = Image.new("RGBA", (40, 40), (0, 0, 0, 0))
    ImageDraw.Draw(transparent).rectangle([10, 10, 19, 29], fill=(255, 0, 0, 255))
    tpath = save(transparent, tmp_path / "t.png")
    assert I.check_image_size(tpath, {"width": 10, "height": 20, "ignore_transparent": True}) == 1.0
    assert I.check_image_size(tpath, {"width": 10, "height": 20}) == 0.0
    assert I.check_image_file_size(path, {"max_size": 10**6}) == 1.0
    assert I.check_image_file_size(path, {"max_size": 10}) == 0.0


def test_triangle_and_textbox_positions(tmp_path):
    # With two colours OSWorld's pick is the commoner one, the background, whose centroid only a
    # big off-centre triangle moves far enough.
    def triangle(corner):
        image = Image.new("RGB", (100, 100), "white")
        x, y = (0, 0) if corner else (40, 40)
        size = 90 if corner else 20
        ImageDraw.Draw(image).polygon([(x, y + size), (x + size, y + size), (x + size // 2, y)], fill="yellow")
        return image

    assert I.check_triangle_position(save(triangle(False), tmp_path / "mid.png")) == 1.0
    assert I.check_triangle_position(save(triangle(True), tmp_path / "corner.png")) == 0.0
    left = Image.new("RGB", (100, 30), "white")
    ImageDraw.Draw(left).rectangle([2, 10, 30, 20], fill="black")
    assert I.check_textbox_on_leftside(save(left, tmp_path / "left.png")) == 1.0
    right = Image.new("RGB", (100, 30), "white")
    ImageDraw.Draw(right).rectangle([60, 10, 90, 20], fill="black")
    assert I.check_textbox_on_leftside(save(right, tmp_path / "right.png")) == 0.0


def test_unreadable_result_scores_zero(tmp_path):
    junk = tmp_path / "junk.png"
    junk.write_text("not an image")
    assert I.check_structure_sim(str(junk), save(scene(), tmp_path / "ref.png")) == 0.0
    assert math.isclose(I.check_image_size(str(junk), {"width": 1}), 0.0)
