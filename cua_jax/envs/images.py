"""Environment images: content-hash tags, and the builder behind launch/images/build.sh.

Layout (launch/images/):
    base/build.sh            builds the base image from debootstrap + `docker import`;
                             called as `build.sh <image:tag>`.
    <name>/Dockerfile        every other image; starts with `ARG BASE_IMAGE` /
                             `FROM ${BASE_IMAGE}` and is built after the base.
    <name>/context.list      optional: repository paths (files or folders, one a line)
                             copied into that image's build context at the same relative
                             path, e.g. the in-environment server's source.
    <name>/pip-wheels.txt    optional: hash-pinned requirements downloaded as wheels
    <name>/pip-sdists.txt    (sdists) into the build context's wheels/ (sdists/) folder.
    <name>/build-args        optional: `NAME=VALUE` lines passed as `--build-arg`s, so a
                             folder of links to another image's files builds a variant
                             of it (trac_bench: the trac image at another scale).
    <name>/on-demand         optional: the image is left out of `build` with no names (what
                             setup runs) and built when first asked for (`ensure_image`):
                             for images only a benchmark uses (trac_bench, 1 GB).

Each image is tagged `cua-jax/<name>:<hash>` and `cua-jax/<name>:latest`, where <hash>
covers the files of its folder, the files named in its context.list, and the base's hash.
A build is skipped when the hash tag exists. Code and tests ask `image_tag(name)` for
the exact tag of the current sources.

Standard-library only, so `launch/images/build.sh` runs it with any Python 3.11.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGES_DIR = REPO_ROOT / "launch" / "images"
REPOSITORY = "cua-jax"
BASE = "base"
_IGNORED_PARTS = ("__pycache__",)
_IGNORED_SUFFIXES = (".pyc", ".pyo")


def image_names() -> list[str]:
    """The images defined under launch/images/, the base first."""
    others = sorted(p.name for p in IMAGES_DIR.iterdir() if p.is_dir() and (p / "Dockerfile").is_file())
    return [BASE] + [n for n in others if n != BASE]


def _context_paths(name: str) -> list[str]:
    listing = IMAGES_DIR / name / "context.list"
    if not listing.is_file():
        return []
    paths = []
    for line in listing.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not (REPO_ROOT / line).exists():
            raise FileNotFoundError(f"{listing}: '{line}' does not exist in the repository")
        paths.append(line)
    return paths


def _build_args(name: str) -> list[str]:
    listing = IMAGES_DIR / name / "build-args"
    if not listing.is_file():
        return []
    args = []
    for line in listing.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            if "=" not in line:
                raise ValueError(f"{listing}: '{line}' is not NAME=VALUE")
            args += ["--build-arg", line]
    return args


def _files_under(path: pathlib.Path) -> list[pathlib.Path]:
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and not any(part in _IGNORED_PARTS for part in p.parts)
        and not p.name.endswith(_IGNORED_SUFFIXES)
    )


def content_hash(name: str) -> str:
    """16 hex digits over the image's sources (and the base's hash for derived images)."""
    digest = hashlib.sha256()
    roots = [IMAGES_DIR / name] + [REPO_ROOT / p for p in _context_paths(name)]
    for root in roots:
        for path in _files_under(root):
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    if name != BASE:
        digest.update(b"base:" + content_hash(BASE).encode())
    return digest.hexdigest()[:16]


def image_tag(name: str) -> str:
    """The exact tag (`cua-jax/<name>:<hash>`) the current sources of image `name` build to."""
    if not (IMAGES_DIR / name).is_dir():
        raise KeyError(f"no image '{name}' under {IMAGES_DIR}; images: {image_names()}")
    return f"{REPOSITORY}/{name}:{content_hash(name)}"


def image_exists(tag: str) -> bool:
    result = subprocess.run(["docker", "image", "inspect", tag], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return result.returncode == 0


def _log(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


# <name>/<file> (a pip requirements file with a --hash on every line) -> the folder of the build
# context its downloads go to, and how pip picks the files.
PINNED_DOWNLOADS = {
    "pip-wheels.txt": ("wheels", "--only-binary=:all:"),
    "pip-sdists.txt": ("sdists", "--no-binary=:all:"),
}


def _download_pinned(folder: pathlib.Path, context: pathlib.Path) -> None:
    """Fetch the hash-pinned packages an image's folder lists (PINNED_DOWNLOADS) into its
    build context, with the pip of the Python running this builder: images need no network."""
    for listing, (target, kind) in PINNED_DOWNLOADS.items():
        if (folder / listing).is_file():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--require-hashes",
                    kind,
                    "-r",
                    str(folder / listing),
                    "-d",
                    str(context / target),
                ],
                check=True,
            )


def build(name: str, force: bool = False) -> str:
    """Build image `name` (and the base first, if needed) unless its hash tag exists."""
    if name != BASE:
        build(BASE)
    tag = image_tag(name)
    latest = f"{REPOSITORY}/{name}:latest"
    if image_exists(tag) and not force:
        return tag
    _log(f"building {tag}")
    started = time.monotonic()
    folder = IMAGES_DIR / name
    if name == BASE:
        subprocess.run(["bash", str(folder / "build.sh"), tag], check=True)
    else:
        with tempfile.TemporaryDirectory(prefix=f"cua-jax-image-{name}-") as context:
            shutil.copytree(folder, context, dirs_exist_ok=True)
            for rel in _context_paths(name):
                source, target = REPO_ROOT / rel, pathlib.Path(context) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                if source.is_dir():
                    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    shutil.copy2(source, target)
            _download_pinned(folder, pathlib.Path(context))
            subprocess.run(
                ["docker", "build", "--build-arg", f"BASE_IMAGE={image_tag(BASE)}", *_build_args(name)]
                + ["-t", tag, context],
                check=True,
                env={**os.environ, "DOCKER_BUILDKIT": "0"},
            )
    subprocess.run(["docker", "tag", tag, latest], check=True)
    _log(f"built {tag} in {time.monotonic() - started:.0f}s")  # launch/setup.sh's summary reads these
    return tag


def ensure_image(name: str) -> str:
    """Start dockerd if needed and build image `name` if missing (as a clean clone needs);
    its exact tag."""
    subprocess.run(["bash", str(REPO_ROOT / "launch" / "dockerd.sh")], check=True)
    tag = image_tag(name)
    if not image_exists(tag):
        subprocess.run(["bash", str(IMAGES_DIR / "build.sh"), name], check=True)
    return tag


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build missing images (all when none are named)")
    build_cmd.add_argument("names", nargs="*")
    build_cmd.add_argument("--force", action="store_true")
    tag_cmd = sub.add_parser("tag", help="print the current tag of an image")
    tag_cmd.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "tag":
        print(image_tag(args.name))
        return
    for name in args.names or [n for n in image_names() if not (IMAGES_DIR / n / "on-demand").exists()]:
        print(build(name, force=args.force))


if __name__ == "__main__":
    main()
