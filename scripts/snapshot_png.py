"""Render the dashboard's snapshot SVGs to PNG, to look at them before committing.

    python scripts/snapshot_png.py [OUT_DIR] [SVG ...]

Default: every SVG under tests/*/__snapshots__, into /tmp/graphtop-snapshots. Needs cairosvg (not a
graphtop dependency: ``pip install cairosvg``). Fonts differ from a terminal's, so letter widths may
drift a little; read the text in the SVG (or the test's screen_text) when alignment matters.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    try:
        import cairosvg  # type: ignore[import-not-found]
    except ImportError:
        print("snapshot_png: needs cairosvg (pip install cairosvg)", file=sys.stderr)
        return 2
    out = Path(argv[0]) if argv else Path("/tmp/graphtop-snapshots")
    repo = Path(__file__).resolve().parents[1]
    svgs = [Path(a) for a in argv[1:]] or sorted(repo.glob("tests/**/__snapshots__/**/*.svg"))
    out.mkdir(parents=True, exist_ok=True)
    for svg in svgs:
        png = out / (svg.stem + ".png")
        cairosvg.svg2png(url=str(svg), write_to=str(png), output_width=1600)
        print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
