"""Check the built site as a reader sees it: in a headless Chromium.

Usage: ``python docs/check_site.py docs/_build/html [--screenshots DIR]``

The site is served over HTTP from the build directory, and

* every internal link of every page (``href`` to a page of the site, with
  its ``#anchor``) resolves: the page exists and has the anchor;
* the landing page, an API page and a tutorial are opened in Chromium
  (Selenium with the system's ``chromedriver``): each renders its title and
  content, every image on it has loaded with a non-zero size (the
  tutorial's figures), its math is typeset by MathJax (served with the
  site, no network needed), and a screenshot of each is saved.

Exits non-zero and says what is wrong otherwise.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlparse

#: page, text it must show, minimum number of loaded images: what a reader
#: opens first (the landing page, each page of the user guide, the API pages
#: of the five objectives, two tutorials)
PAGES = (
    ("index.html", "numpyro-pvi", 0),
    ("guide/swap_the_loss.html", "held-out log score", 0),
    ("guide/choosing_an_objective.html", "Choosing", 0),
    ("guide/choosing_lambda.html", "selected", 0),
    ("guide/did_it_work.html", "reliable", 0),
    ("guide/scale_out.html", "mesh", 0),
    ("api/generated/numpyro_pvi.PredictiveELBO.html", "PredictiveELBO", 0),
    ("api/generated/numpyro_pvi.PACmELBO.html", "PACmELBO", 0),
    ("api/generated/numpyro_pvi.SoftCVIELBO.html", "SoftCVIELBO", 0),
    ("api/generated/numpyro_pvi.StratifiedELBO.html", "StratifiedELBO", 0),
    ("api/generated/numpyro_pvi.SNISForwardKL.html", "SNISForwardKL", 0),
    ("tutorials/01_swap_the_loss.html", "Swap the loss", 3),
    ("tutorials/06_did_it_work.html", "k̂", 3),
)


class _Links(HTMLParser):
    """The ``href``/``src`` targets and the ``id``s of one page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            if (tag == "a" and name == "href") or (tag == "img" and name == "src"):
                self.links.append(value)


@functools.cache
def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def broken_links(root: Path) -> list[str]:
    """Internal links of every page of the site that do not resolve."""
    problems = []
    for page in sorted(root.rglob("*.html")):
        if "_sources" in page.parts or "_modules" in page.parts:
            continue
        for link in _parse(page).links:
            url, fragment = urldefrag(link)
            if (
                urlparse(url).scheme
                or url.startswith("//")
                or url.startswith("mailto:")
            ):
                continue  # another site
            target = (page.parent / unquote(url)).resolve() if url else page
            if target.is_dir():
                target = target / "index.html"
            where = f"{page.relative_to(root)}: {link}"
            if not target.exists():
                problems.append(f"{where} (no such file)")
            elif (
                fragment
                and target.suffix == ".html"
                and fragment not in _parse(target).ids
            ):
                problems.append(f"{where} (no anchor #{fragment})")
    return problems


def _serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        raise SystemExit(
            "check_site: Chromium and chromedriver are needed (Debian: apt-get "
            "install chromium chromium-driver; `make docs-check` installs them "
            "when run as root)."
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,2000",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


_IMAGES = """
return Array.from(document.images).map(
    img => [img.getAttribute('src'), img.complete && img.naturalWidth > 0]);
"""


#: headings or math wider than their box (clipped titles and formulas), and
#: the number of links in the sidebar of sections
_LAYOUT = """
const wide = (e, box) => e.scrollWidth > box.clientWidth + 2;
const clipped = [
    ...Array.from(document.querySelectorAll('main h1')).filter(e => wide(e, e)),
    ...Array.from(document.querySelectorAll('main mjx-container[display="true"]'))
        .filter(e => wide(e, e.parentElement)),
].map(e => e.textContent.slice(0, 60));
const sidebar = document.querySelectorAll('.bd-sidebar-primary a.reference').length;
return [clipped, sidebar];
"""


_MATH = """
return [document.querySelectorAll('.math').length,
        document.querySelectorAll('mjx-container').length];
"""


def _math_typeset(browser, timeout: float = 20.0) -> bool:
    """Whether MathJax (served with the site) typeset the page's math."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        num_math, num_typeset = browser.execute_script(_MATH)
        if num_math == 0 or num_typeset > 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def rendered_pages(base: str, shots: Path) -> list[str]:
    """Open the checked pages in Chromium; what is wrong with them."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    problems = []
    shots.mkdir(parents=True, exist_ok=True)
    browser = _browser()
    try:
        for page, text, min_images in PAGES:
            browser.get(urljoin(base, page))
            WebDriverWait(browser, 30).until(
                lambda b: b.execute_script("return document.readyState") == "complete"
            )
            body = browser.find_element(By.TAG_NAME, "main").text
            if text not in body:
                problems.append(f"{page}: the rendered page does not show {text!r}")
            if not _math_typeset(browser):
                problems.append(f"{page}: its math is not typeset (MathJax)")
            clipped, sidebar = browser.execute_script(_LAYOUT)
            if clipped:
                problems.append(f"{page}: clipped: {clipped}")
            if page.startswith("guide/") and sidebar == 0:
                problems.append(f"{page}: the sidebar shows no pages")
            images = browser.execute_script(_IMAGES)
            unloaded = [src for src, ok in images if not ok]
            if unloaded:
                problems.append(f"{page}: images not loaded: {unloaded}")
            if sum(ok for _, ok in images) < min_images:
                problems.append(
                    f"{page}: {sum(ok for _, ok in images)} figures shown, "
                    f"expected at least {min_images}"
                )
            shot = shots / (page.replace("/", "_").removesuffix(".html") + ".png")
            browser.save_screenshot(str(shot))
            print(f"check_site: {page}: {len(images)} images, screenshot {shot}")
    finally:
        browser.quit()
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path, help="the built HTML site")
    parser.add_argument("--screenshots", type=Path, default=None)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    problems = broken_links(root)
    server, base = _serve(root)
    try:
        problems += rendered_pages(
            base, args.screenshots or root.parent / "screenshots"
        )
    finally:
        server.shutdown()
    for problem in problems:
        print(f"check_site: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_site: {root}: every internal link resolves; pages render")
    return int(bool(problems))


if __name__ == "__main__":
    sys.exit(main())
