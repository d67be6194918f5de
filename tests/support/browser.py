"""Checking a page as a reader sees it in headless Chromium (rlbench.analysis.browser): skip (or, where CI
requires Chromium, fail) without it, an element's box, and whether pixels are drawn inside a box of a screenshot."""

from __future__ import annotations

from pathlib import Path

from support.needs import unavailable

# An element's bounding box in CSS pixels: BOX % "<a JavaScript expression giving the element>".
BOX = "(e => { const r = e.getBoundingClientRect(); return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; })(%s)"


def chromium_or_skip() -> None:
    from rlbench.analysis.browser import find_chromium

    if find_chromium() is None:
        unavailable("browser", "Chromium not installed (Debian: apt-get install chromium); the browser tests need it")


def coloured_pixels(png: Path, box: dict) -> int:
    """Pixels of a screenshot inside box (CSS px at device scale 1) that are clearly coloured (not grey)."""
    from PIL import Image

    image = Image.open(png).convert("RGB")
    left, top = max(0, int(box["left"])), max(0, int(box["top"]))
    right, bottom = min(image.width, int(box["right"])), min(image.height, int(box["bottom"]))
    region = image.crop((left, top, right, bottom))
    data = region.tobytes()
    return sum(1 for i in range(0, len(data), 3) if max(data[i : i + 3]) - min(data[i : i + 3]) > 60)


def dark_pixels(png: Path, box: dict) -> int:
    """Pixels of a screenshot inside box that are dark (text, rules): something is drawn there."""
    from PIL import Image

    image = Image.open(png).convert("L")
    left, top = max(0, int(box["left"])), max(0, int(box["top"]))
    right, bottom = min(image.width, int(box["right"])), min(image.height, int(box["bottom"]))
    region = image.crop((left, top, right, bottom))
    return sum(1 for value in region.tobytes() if value < 128)
