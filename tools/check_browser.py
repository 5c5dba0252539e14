"""Open the built site in a real headless browser: the home page, one reference page, and search.

    python tools/check_browser.py [build/site] [--screenshots DIR]

Serves the site folder over HTTP on a free local port, loads each page in Debian's ``chromium``
(headless, sandbox off, no network beyond the local server, a fresh profile), takes a screenshot and
reads the DOM the browser built (after its scripts ran): the page must show the navigation sidebar
and the search box of the theme, and the reference page the ``Accelerator`` entry. Then it searches
as a reader does, twice: ``index.html`` opened from disk (``file://``, as the build's last line tells
you to) and over HTTP, it clicks the search box, types a word and waits for results to be listed
(``tools/devtools_pipe.py`` drives chromium). Exits 0 with a "skipped" line when no chromium is
installed (``apt-get install -y chromium`` gives one).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import devtools_pipe  # noqa: E402

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--window-size=1280,900",
)
#: page -> marks its DOM must contain (what a reader looks for on it).
PAGES = {
    "index.html": {
        "sidebar": 'class="md-nav md-nav--primary"',
        "search box": 'class="md-search__input"',
    },
    "reference/accelerator.html": {
        "sidebar": 'class="md-nav md-nav--primary"',
        "search box": 'class="md-search__input"',
        "the Accelerator entry": 'id="accel_train.',
        "a method signature": "save_state",
    },
}


#: What the search check types: a word every build of the guide has pages about.
SEARCH_QUERY = "checkpoint"
SEARCH_INPUT = ".md-search__input"
SEARCH_RESULT = ".md-search-result__item"
SEARCH_META = ".md-search-result__meta"


def find_browser() -> str | None:
    """Path of the first chromium-like browser on PATH, or None."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


@contextlib.contextmanager
def serve(folder: pathlib.Path) -> Iterator[str]:
    """An HTTP server for ``folder`` on 127.0.0.1 and a free port, for the duration of the block."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _browser(browser: str, profile: pathlib.Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [browser, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def check_page(browser: str, url: str, marks: dict[str, str], screenshot: pathlib.Path) -> list[str]:
    """Load ``url``; write its screenshot; return what is missing from its DOM (empty when all is there)."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="accel-chromium-") as profile:
        dom = _browser(browser, pathlib.Path(profile), "--virtual-time-budget=5000", "--dump-dom", url)
    if dom.returncode != 0 or "<html" not in dom.stdout:
        return [f"{url}: chromium could not load it (exit {dom.returncode}): {dom.stderr[-1000:]}"]
    for what, mark in marks.items():
        if mark not in dom.stdout:
            problems.append(f"{url}: no {what} (looked for {mark!r})")
    with tempfile.TemporaryDirectory(prefix="accel-chromium-") as profile:
        shot = _browser(browser, pathlib.Path(profile), "--virtual-time-budget=5000", f"--screenshot={screenshot}", url)
    if shot.returncode != 0 or not screenshot.exists() or screenshot.stat().st_size < 5000:
        problems.append(f"{url}: no screenshot written ({shot.stderr[-500:]})")
    return problems


def check_search(browser: str, url: str, query: str = SEARCH_QUERY, seconds: float = 30.0) -> tuple[int, list[str]]:
    """Load ``url``, click its search box, type ``query`` and wait up to ``seconds`` for results.

    Returns:
        How many results were listed, and the problems (empty when some were).
    """
    with tempfile.TemporaryDirectory(prefix="accel-chromium-") as profile:
        command = [browser, *FLAGS, f"--user-data-dir={profile}"]
        try:
            with devtools_pipe.Browser(command, timeout=seconds) as tab:
                session = tab.open(url)
                ready = f"document.readyState === 'complete' && !!document.querySelector({SEARCH_INPUT!r})"
                if not tab.wait_for(session, ready, seconds):
                    return 0, [f"{url}: no search box ({SEARCH_INPUT}) once loaded"]
                tab.click(session, SEARCH_INPUT)
                tab.type(session, query)
                count = tab.wait_for(session, f"document.querySelectorAll({SEARCH_RESULT!r}).length", seconds)
                if count:
                    return int(count), []
                meta = tab.evaluate(
                    session, f"(document.querySelector({SEARCH_META!r}) || {{textContent: ''}}).textContent"
                )
                errors = "; ".join(tab.exceptions()) or "none"
                shown = " ".join((meta or "").split()) or "nothing"
                return 0, [
                    f"{url}: typing {query!r} into search listed no result in {seconds:.0f} s "
                    f"(the search panel says {shown!r}; script errors: {errors})"
                ]
        except devtools_pipe.DevToolsError as error:
            return 0, [f"{url}: the browser could not be driven: {error}"]


def main(argv: list[str] | None = None) -> int:
    """Check the pages of ``PAGES`` in the site folder; print one line per page and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", type=pathlib.Path, default=ROOT / "build" / "site")
    parser.add_argument("--screenshots", type=pathlib.Path, default=ROOT / "build" / "screenshots")
    args = parser.parse_args(argv)
    browser = find_browser()
    if browser is None:
        print("browser check: skipped (no chromium on PATH; apt-get install -y chromium)")
        return 0
    if not (args.site / "index.html").exists():
        print(f"browser check: no site at {args.site} (build it first: python tools/build_guide.py)")
        return 1
    args.screenshots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with serve(args.site) as base:
        for page, marks in PAGES.items():
            screenshot = args.screenshots / (page.replace("/", "_").replace(".html", ".png"))
            found = check_page(browser, base + page, marks, screenshot)
            problems += found
            print(f"{'ok' if not found else 'FAILED':7} {page} (screenshot {_shown(screenshot)})")
        searches = {"file://": (args.site.resolve() / "index.html").as_uri(), "HTTP": base + "index.html"}
        for how, url in searches.items():
            count, found = check_search(browser, url)
            problems += found
            print(f"{'ok' if not found else 'FAILED':7} search from {how}: {SEARCH_QUERY!r} listed {count} result(s)")
    for problem in problems:
        print(problem)
    print(f"browser check: {len(PAGES)} pages, search from file:// and HTTP, {len(problems)} problem(s)")
    return 1 if problems else 0


def _shown(path: pathlib.Path) -> pathlib.Path:
    try:
        return path.resolve().relative_to(ROOT)
    except ValueError:
        return path


if __name__ == "__main__":
    sys.exit(main())
