"""Pure numeric measures behind the image and document metrics (numpy only).

structural_similarity matches scikit-image's default SSIM (7x7 uniform window, sample
covariance, K1 = 0.01, K2 = 0.03, the mean over windows that lie inside the image,
averaged over channels); srgb_to_lab and ciede2000 follow scikit-image's rgb2lab (D65,
2° observer) and deltaE_ciede2000; laplacian_variance follows OpenCV's 3x3 Laplacian
with reflected borders.
"""

from __future__ import annotations

import math

import numpy as np


def _window_means(image: np.ndarray, size: int) -> np.ndarray:
    """The mean of every size x size window lying inside a 2-D image (integral image)."""
    padded = np.zeros((image.shape[0] + 1, image.shape[1] + 1), dtype=np.float64)
    padded[1:, 1:] = image.cumsum(axis=0).cumsum(axis=1)
    sums = padded[size:, size:] - padded[:-size, size:] - padded[size:, :-size] + padded[:-size, :-size]
    return sums / (size * size)


def structural_similarity(first: np.ndarray, second: np.ndarray, data_range: float = 255.0, win_size: int = 7) -> float:
    """Mean SSIM of two equally shaped images (H x W, or H x W x C averaged over C).

    Raises ValueError for mismatched shapes, an even window, or a window larger than the
    image.
    """
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"images of different shapes {a.shape} and {b.shape}")
    if a.ndim == 3:
        return float(
            np.mean([structural_similarity(a[..., c], b[..., c], data_range, win_size) for c in range(a.shape[2])])
        )
    if a.ndim != 2:
        raise ValueError(f"an image is H x W or H x W x C, got shape {a.shape}")
    if win_size < 1 or win_size % 2 == 0:
        raise ValueError(f"the window size must be odd and positive, got {win_size}")
    if win_size > min(a.shape):
        raise ValueError(f"a {win_size}x{win_size} window exceeds the image extent {a.shape}")
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    n = win_size * win_size
    cov_norm = n / (n - 1)
    ux, uy = _window_means(a, win_size), _window_means(b, win_size)
    uxx, uyy, uxy = (_window_means(p, win_size) for p in (a * a, b * b, a * b))
    vx, vy, vxy = cov_norm * (uxx - ux * ux), cov_norm * (uyy - uy * uy), cov_norm * (uxy - ux * uy)
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return float(s.mean())


_SRGB_TO_XYZ = np.array(
    [[0.412453, 0.357580, 0.180423], [0.212671, 0.715160, 0.072169], [0.019334, 0.119193, 0.950227]]
)
_D65 = np.array([0.95047, 1.0, 1.08883])


def srgb_to_lab(rgb) -> np.ndarray:
    """CIELAB (D65) of an sRGB colour given in [0, 1] per channel."""
    c = np.asarray(rgb, dtype=np.float64)
    linear = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    xyz = _SRGB_TO_XYZ @ linear / _D65
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16.0 / 116.0)
    return np.array([116.0 * f[1] - 16.0, 500.0 * (f[0] - f[1]), 200.0 * (f[1] - f[2])])


def ciede2000(lab1, lab2) -> float:
    """The CIEDE2000 colour difference of two CIELAB colours (kL = kC = kH = 1)."""
    l1, a1, b1 = (float(v) for v in lab1)
    l2, a2, b2 = (float(v) for v in lab2)
    c_mean = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_mean**7 / (c_mean**7 + 25.0**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    dl, dc = l2 - l1, c2p - c1p
    if c1p * c2p == 0:
        dh = 0.0
    else:
        dh = h2p - h1p
        if dh > 180:
            dh -= 360
        elif dh < -180:
            dh += 360
    dh_big = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh) / 2)
    l_mean, cp_mean = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        h_mean = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        h_mean = (h1p + h2p) / 2
    elif h1p + h2p < 360:
        h_mean = (h1p + h2p + 360) / 2
    else:
        h_mean = (h1p + h2p - 360) / 2
    t = (
        1
        - 0.17 * math.cos(math.radians(h_mean - 30))
        + 0.24 * math.cos(math.radians(2 * h_mean))
        + 0.32 * math.cos(math.radians(3 * h_mean + 6))
        - 0.20 * math.cos(math.radians(4 * h_mean - 63))
    )
    sl = 1 + 0.015 * (l_mean - 50) ** 2 / math.sqrt(20 + (l_mean - 50) ** 2)
    sc = 1 + 0.045 * cp_mean
    sh = 1 + 0.015 * cp_mean * t
    rt = (
        -2
        * math.sqrt(cp_mean**7 / (cp_mean**7 + 25.0**7))
        * math.sin(math.radians(60 * math.exp(-(((h_mean - 275) / 25) ** 2))))
    )
    return math.sqrt((dl / sl) ** 2 + (dc / sc) ** 2 + (dh_big / sh) ** 2 + rt * (dc / sc) * (dh_big / sh))


def rgb_difference(rgb1, rgb2) -> float:
    """CIEDE2000 difference of two 0-255 RGB colours."""
    return ciede2000(
        srgb_to_lab(np.asarray(rgb1, dtype=np.float64) / 255.0), srgb_to_lab(np.asarray(rgb2, dtype=np.float64) / 255.0)
    )


def laplacian_variance(gray: np.ndarray) -> float:
    """The variance of the 4-neighbour Laplacian of a 2-D image (borders reflected
    without repeating the edge), a sharpness measure."""
    g = np.asarray(gray, dtype=np.float64)
    if g.ndim != 2 or min(g.shape) < 2:
        raise ValueError(f"a grayscale image of at least 2x2 pixels is needed, got shape {g.shape}")
    p = np.pad(g, 1, mode="reflect")
    lap = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * g
    return float(lap.var())


def normalised_rgb_distance(rgb1, rgb2) -> float:
    """Euclidean distance of two 0-255 RGB colours divided by the largest one (white to
    black), in [0, 1]."""
    d = np.asarray(rgb1, dtype=np.float64) - np.asarray(rgb2, dtype=np.float64)
    return float(np.sqrt((d * d).sum()) / math.sqrt(3 * 255.0**2))
