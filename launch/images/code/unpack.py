"""Image build step: unpack pure-Python wheels into site-packages and sdists into /opt/repos.

    python3 unpack.py WHEELS_DIR SDISTS_DIR

A wheel is a zip of the installed files (with its .dist-info), so unpacking a pure one is an
installation; an sdist `<name>-<version>.tar.gz` becomes /opt/repos/<name> (the name as
pip-sdists.txt spells it, lowercase, '_' as '-').
"""

import os
import pathlib
import re
import sys
import sysconfig
import tarfile
import zipfile

wheels, sdists = map(pathlib.Path, sys.argv[1:3])
site = pathlib.Path(sysconfig.get_paths()["purelib"])
site.mkdir(parents=True, exist_ok=True)
for wheel in sorted(wheels.glob("*.whl")):
    zipfile.ZipFile(wheel).extractall(site)
repos = pathlib.Path("/opt/repos")
repos.mkdir(parents=True, exist_ok=True)
for sdist in sorted(sdists.glob("*.tar.gz")):
    match = re.fullmatch(r"(.+)-([0-9][^-]*)\.tar\.gz", sdist.name)
    name = match.group(1).lower().replace("_", "-")
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        if hasattr(tarfile, "data_filter"):  # refuses members outside the target
            tar.extractall(repos, filter="data")
        else:
            for member in tar.getmembers():
                if member.name.startswith("/") or ".." in member.name.split("/") or member.issym() or member.islnk():
                    raise ValueError(f"{sdist.name}: unsafe member {member.name}")
            tar.extractall(repos)
    os.rename(repos / top, repos / name)
    for cache in (repos / name).rglob("__pycache__"):
        for f in cache.iterdir():
            f.unlink()
        cache.rmdir()
print("site-packages:", site, "repos:", sorted(p.name for p in repos.iterdir()))
