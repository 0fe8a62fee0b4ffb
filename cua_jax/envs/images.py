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
    <name>/parent            optional: the name of another image here that this one is
                             built FROM (its tag is the `BASE_IMAGE` build argument, and it
                             is built first): a family of images over one (osworld_apps
                             adds applications to osworld, so a run of office tasks does
                             not pay for a browser, GIMP and VLC).

Each image is tagged `cua-jax/<name>:<hash>` and `cua-jax/<name>:latest`, where <hash>
covers the files of its folder, the files named in its context.list, and its parent's hash
(the base's, unless a `parent` file names another).
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


def _declared_parent(name: str) -> str:
    listing = IMAGES_DIR / name / "parent"
    if not listing.is_file():
        return BASE
    chosen = listing.read_text().split("#", 1)[0].strip()
    if not (IMAGES_DIR / chosen).is_dir():
        raise ValueError(f"{listing}: no image {chosen!r} under {IMAGES_DIR}")
    return chosen


def parent(name: str) -> str | None:
    """The image `name` is built FROM: its `parent` file's image, else the base (None for
    the base itself). A parent that is not an image here, or a cycle, raises."""
    if name == BASE:
        return None
    chain, current = [name], _declared_parent(name)
    while current != BASE:
        if current in chain:
            raise ValueError(f"the images' parent files form a cycle: {' -> '.join([*chain, current])}")
        chain.append(current)
        current = _declared_parent(current)
    return _declared_parent(name)


def lineage(name: str) -> list[str]:
    """`name`, its parent, the parent's parent ... down to the base: the images whose tasks
    run on image `name` too (each is built FROM the next)."""
    chain = [name]
    while (above := parent(chain[-1])) is not None:
        chain.append(above)
    return chain


def covering_image(names: set[str] | list[str]) -> str | None:
    """The image among `names` built from all the others (whose lineage holds them all), or
    None when none is (or `names` is empty): the one image a pool of them all runs."""
    for name in sorted(set(names)):
        if set(names) <= set(lineage(name)):
            return name
    return None


def content_hash(name: str) -> str:
    """16 hex digits over the image's sources (and its parent's hash for derived images)."""
    digest = hashlib.sha256()
    roots = [IMAGES_DIR / name] + [REPO_ROOT / p for p in _context_paths(name)]
    for root in roots:
        for path in _files_under(root):
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    above = parent(name)
    if above == BASE:
        digest.update(b"base:" + content_hash(BASE).encode())
    elif above is not None:
        digest.update(f"parent:{above}:".encode() + content_hash(above).encode())
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
    """Build image `name` (and its parent first, if needed) unless its hash tag exists."""
    above = parent(name)
    if above is not None:
        build(above)
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
                ["docker", "build", "--build-arg", f"BASE_IMAGE={image_tag(above)}", *_build_args(name)]
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
