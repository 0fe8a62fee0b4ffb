"""The trajectory viewer of a training run, as a static site:

    python -m experiments.view RUN_DIR [OTHER_RUN_DIR] [--out DIR]

Writes DIR/index.html (default: RUN_DIR/viewer/): the run's curves, success and quarantines
per task, and one page per traced episode (screenshots with the action drawn over them, the
reply's tokens shaded by logprob). With OTHER_RUN_DIR, the traced episodes both runs share
(same evaluation label and episode id: same task and seed) are shown side by side. The site
needs no network: open index.html in a browser. See `cua_jax.observe.viewer`.
"""

from __future__ import annotations

import argparse
import os
import sys

from cua_jax.observe.viewer import build_site


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.view", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a training run's workdir")
    parser.add_argument("other_run_dir", nargs="?", help="a second run to compare with")
    parser.add_argument("--out", help="where to write the site (default: RUN_DIR/viewer)")
    args = parser.parse_args(argv)
    out = args.out or os.path.join(args.run_dir, "viewer")
    try:
        index = build_site([d for d in (args.run_dir, args.other_run_dir) if d], out)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
