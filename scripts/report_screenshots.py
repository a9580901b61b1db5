"""Screenshots of `rig report --html` in headless Chromium, at a desktop width (1400 px) and a phone width (390 px).

    python scripts/report_screenshots.py RUN_DIR_OR_HTML OUT_DIR [--expanded] [--rig-arg=--slo=tpot=10ms ...]

RUN_DIR is reported first (`rig report RUN_DIR --html OUT_DIR/report.html`); an .html file is shot as it is.
``--expanded`` also shoots the page with every <details> section open (the tables and plots). Writes
desktop.png and phone.png (and desktop_expanded.png, phone_expanded.png) into OUT_DIR and prints their paths.
Chromium: `apt-get install -y chromium`; the CHROMIUM variable names another binary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WIDTHS = {"desktop": (1400, 1), "phone": (390, 2)}  # CSS px, device pixel ratio (a phone's screen is dense)
HEIGHT = {"desktop": 1800, "phone": 2600}  # CSS px shot from the top of the page
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]


def chromium() -> str | None:
    """The Chromium binary: $CHROMIUM, else chromium or chromium-browser on PATH."""
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def shoot(binary: str, page: Path, out: Path, width: int, height: int, scale: int) -> Path:
    """One screenshot of ``page`` at ``width`` x ``height`` CSS px, in a fresh profile."""
    with tempfile.TemporaryDirectory(prefix="rig-chromium-") as profile:
        argv = [
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--force-device-scale-factor={scale}",
            f"--screenshot={out}",
            page.resolve().as_uri(),
        ]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)
    if not out.exists():
        raise RuntimeError(f"chromium wrote no screenshot {out}")
    return out


def expanded(page: Path, out_dir: Path) -> Path:
    """A copy of the page with every <details> section open."""
    text = page.read_text().replace("<details>", "<details open>")
    path = out_dir / f"{page.stem}_expanded.html"
    path.write_text(text)
    return path


def report_html(run_dir: Path, out_dir: Path, rig_args: list[str]) -> Path:
    page = out_dir / "report.html"
    argv = [sys.executable, "-m", "rig.cli", "report", str(run_dir), "--html", str(page), *rig_args]
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    return page


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = chromium()
    if binary is None:
        print("no chromium found (apt-get install -y chromium, or set CHROMIUM)", file=sys.stderr)
        return 2
    source, out_dir = Path(args[0]), Path(args[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    rig_args = [a.split("=", 1)[1].replace("=", " ", 1).split(" ", 1) for a in argv if a.startswith("--rig-arg=")]
    page = source if source.suffix == ".html" else report_html(source, out_dir, [x for a in rig_args for x in a])
    pages = {"": page}
    if "--expanded" in argv:
        pages["_expanded"] = expanded(page, out_dir)
    for suffix, p in pages.items():
        for name, (width, scale) in WIDTHS.items():
            print(shoot(binary, p, out_dir / f"{name}{suffix}.png", width, HEIGHT[name], scale))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
