"""Open every page of the built documentation site in headless Chromium and check it.

    mkdocs build --strict && python tools/check_site.py site/

The site is served over HTTP from a local port. Each page is loaded by Chromium
(``chromium --headless --dump-dom``: the DOM after its scripts ran), and the check fails when

* the server answered any request the browser made (pages, images, stylesheets, scripts) with an error,
* a link or image on a page points into the site at a file that does not exist,
* a link's ``#fragment`` names no element of the page it points to,
* an image is empty or not an image.

Links to other hosts are counted, not followed (the machine may be offline).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF8", b"<svg", b"<?xml")


class Page(HTMLParser):
    """The links, images and element ids of one rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.images: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if a.get("name") and tag == "a":
            self.ids.add(a["name"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "img" and a.get("src"):
            self.images.append(a["src"])


class Recorder(http.server.SimpleHTTPRequestHandler):
    failures: list[str] = []

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        pass

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        Recorder.failures.append(f"{code} {self.path}")
        super().send_error(code, message, explain)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    sys.exit("no Chromium found: apt-get install chromium (Debian's package)")


def render(browser: str, url: str) -> str:
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--virtual-time-budget=3000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )
    if result.returncode != 0 or "<html" not in result.stdout:
        raise RuntimeError(f"Chromium could not load {url}: {result.stderr[-500:]}")
    return result.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built site (mkdocs build)")
    args = parser.parse_args(argv)
    site = args.site.resolve()
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.name != "404.html")
    if not pages:
        sys.exit(f"no HTML pages under {site}: run `mkdocs build` first")

    Recorder.failures.clear()
    handler = functools.partial(Recorder, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = chromium()

    rendered: dict[str, Page] = {}
    problems: list[str] = []
    external = 0
    for page in pages:
        dom = Page()
        dom.feed(render(browser, base + page))
        rendered[page] = dom
    for page, dom in rendered.items():
        page_url = base + page
        for src in dom.images:
            target = urlparse(urljoin(page_url, src))
            if target.netloc != urlparse(base).netloc:
                external += 1
                continue
            path = site / target.path.lstrip("/")
            if not path.is_file():
                problems.append(f"{page}: image {src} does not exist")
            elif not path.read_bytes()[:16].lstrip().startswith(IMAGE_MAGIC):
                problems.append(f"{page}: image {src} is not an image")
        for href in dom.links:
            target = urlparse(urljoin(page_url, href))
            if target.scheme not in ("http", "https"):
                continue
            if target.netloc != urlparse(base).netloc:
                external += 1
                continue
            rel = target.path.lstrip("/") or "index.html"
            if rel.endswith("/"):
                rel += "index.html"
            if not (site / rel).exists():
                problems.append(f"{page}: link {href} points at {rel}, which does not exist")
            elif target.fragment and rel in rendered and target.fragment not in rendered[rel].ids:
                problems.append(f"{page}: link {href}: no element with id {target.fragment!r} in {rel}")
    problems += [f"the browser's request failed: {failure}" for failure in Recorder.failures]
    server.shutdown()

    links = sum(len(d.links) for d in rendered.values())
    images = sum(len(d.images) for d in rendered.values())
    print(f"{len(pages)} pages loaded in Chromium; {links} links and {images} images checked "
          f"({external} to other hosts, not followed); {len(problems)} problems")
    for problem in problems:
        print("  " + problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
