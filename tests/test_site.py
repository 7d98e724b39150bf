"""The built site, checked the way a reader meets it: in a browser.

1. The book is built with jupyter-book into ``_build/html`` with warnings as errors. Notebook
   execution is switched OFF for this build: ``make test`` runs nbval on every notebook in the same
   pytest run, and nbval proves (strictly) that the outputs committed in the notebooks are exactly
   what a fresh run produces; executing them all a second time here would double the run time and
   prove nothing more. ``make book`` still builds with execution forced.
2. Every internal link and resource of every built page (``href``/``src`` without a scheme) points
   at a file that exists, and at an element id that exists when it names a ``#fragment``.
3. Headless Chromium opens the introduction, a chapter with plots and chapter 10 from a loopback
   HTTP server and we check each page: the title is there, every ``<img>`` finished loading with a
   non-zero size, no request to the site failed, and no Python traceback shows. A full-page
   screenshot of each is kept in ``_build/screenshots/``.

Chromium is driven through its DevTools protocol over ``--remote-debugging-pipe`` (JSON messages
separated by NUL bytes on file descriptors 3 and 4), so no browser-automation package is needed.
Without the ``chromium`` executable the browser test skips; ``make browser`` (part of ``make
test``) installs Debian's ``chromium`` package when run as root.
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"
HTML = BUILD / "html"
SCREENSHOTS = BUILD / "screenshots"

# Pages opened in the browser: (page, its source, does it have plots?)
PAGES = [
    ("intro.html", "intro.md", False),
    ("chapters/03_positional_encoding.html", "chapters/03_positional_encoding.ipynb", True),
    ("chapters/10_training.html", "chapters/10_training.ipynb", True),
]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-quic",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
]
TRACEBACK = "Traceback (most recent call last)"


# --------------------------------------------------------------------------------------------
# Building the site
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site() -> Path:
    """Build the book once (execution off, warnings are errors) and return ``_build/html``."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config.setdefault("execute", {})["execute_notebooks"] = "off"  # see the module docstring
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    BUILD.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "_config.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        cmd = [str(jupyter_book), "build", str(ROOT), "--config", str(config_path)]
        # --all: rebuild every page, so warnings of pages unchanged since an earlier build are
        # reported again instead of being hidden by Sphinx's incremental build.
        cmd += ["--warningiserror", "--keep-going", "--all"]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    log = done.stdout + done.stderr
    (BUILD / "site-test-build.log").write_text(log)
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert done.returncode == 0 and not warnings, (
        f"the site build failed or warned (exit code {done.returncode}); full log in "
        f"_build/site-test-build.log:\n" + "\n".join(warnings or log.splitlines()[-40:])
    )
    assert (HTML / "intro.html").is_file(), "the build produced no _build/html/intro.html"
    return HTML


# --------------------------------------------------------------------------------------------
# Links, checked on the files
# --------------------------------------------------------------------------------------------


class _LinkParser(HTMLParser):
    """Collects the links/resources of a page and the ids it defines."""

    LINK_ATTRS = {"a": "href", "link": "href", "img": "src", "script": "src", "source": "src"}

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if values.get(key):
                self.ids.add(values[key])
        wanted = self.LINK_ATTRS.get(tag)
        if wanted and values.get(wanted):
            self.links.append(values[wanted])


@functools.cache
def _parse(page: Path) -> _LinkParser:
    parser = _LinkParser()
    parser.feed(page.read_text(encoding="utf-8", errors="replace"))
    return parser


def broken_links(html_dir: Path) -> list[str]:
    """Every internal link of every page under ``html_dir`` that does not resolve."""
    html_dir = html_dir.resolve()
    problems = []
    pages = sorted(p for p in html_dir.rglob("*.html") if "_static" not in p.parts)
    for page in pages:
        for link in _parse(page).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:  # http(s):, mailto:, data:, //host: not ours
                continue
            if not parts.path:  # "#fragment" on the same page ("#" alone is a script hook)
                target = page
            else:
                target = (page.parent / unquote(parts.path)).resolve()
                if target.is_dir():
                    target = target / "index.html"
            where = f"{page.relative_to(html_dir)}: {link!r}"
            if html_dir not in target.parents:
                problems.append(f"{where} leaves the site")
            elif not target.is_file():
                problems.append(f"{where} -> missing file {target.relative_to(html_dir)}")
            elif parts.fragment and target.suffix == ".html":
                if unquote(parts.fragment) not in _parse(target).ids:
                    problems.append(f"{where} -> no id {parts.fragment!r} in that page")
    return problems


def test_every_internal_link_resolves(site: Path) -> None:
    pages = list(site.rglob("*.html"))
    assert len(pages) >= len(PAGES), f"only {len(pages)} pages were built"
    problems = broken_links(site)
    assert not problems, f"{len(problems)} broken internal link(s):\n" + "\n".join(problems[:50])


# --------------------------------------------------------------------------------------------
# The browser
# --------------------------------------------------------------------------------------------


class _Server:
    """A loopback HTTP server for the built site that remembers failed requests."""

    def __init__(self, directory: Path) -> None:
        failed: list[str] = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_request(self, code="-", size="-") -> None:  # noqa: ANN001 (stdlib signature)
                if str(getattr(code, "value", code)).startswith(("4", "5")):
                    failed.append(f"{code} {self.path}")

            def log_message(self, *args) -> None:  # keep the test output quiet
                pass

        handler = functools.partial(Handler, directory=str(directory))
        self.failed = failed
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# Runs in the child: move the two pipe ends to fds 3 (commands in) and 4 (replies out), as
# --remote-debugging-pipe expects, then become Chromium.
_TRAMPOLINE = """
import fcntl, os, sys
r, w = (fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:3])
os.close(int(sys.argv[1])); os.close(int(sys.argv[2]))
os.dup2(r, 3); os.dup2(w, 4); os.close(r); os.close(w)
os.execv(sys.argv[3], sys.argv[3:])
"""


class Chromium:
    """Headless Chromium driven through the DevTools protocol over a pipe."""

    def __init__(self, executable: str, profile: Path, timeout: float = 60.0) -> None:
        self.timeout = timeout
        cmd_read, self._cmd_write = os.pipe()  # we write commands, Chromium reads (its fd 3)
        self._reply_read, reply_write = os.pipe()  # Chromium writes replies (its fd 4)
        self.log_path = profile / "chromium.log"
        args = [*CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1280,900"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _TRAMPOLINE, str(cmd_read), str(reply_write)]
                + [executable, *args, "about:blank"],
                pass_fds=(cmd_read, reply_write),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        os.close(cmd_read)
        os.close(reply_write)
        self._messages: queue.Queue[dict | None] = queue.Queue()
        self._events: list[dict] = []
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buffer = b""
        while chunk := os.read(self._reply_read, 1 << 16):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for message in messages:
                self._messages.put(json.loads(message))
        self._messages.put(None)  # the browser closed its end

    def _next_message(self, deadline: float, waiting_for: str) -> dict:
        try:
            message = self._messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"Chromium did not answer in time ({waiting_for})") from None
        if message is None:
            log = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"Chromium exited ({waiting_for}); its log ends with:\n{log}")
        return message

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and return its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        message: dict = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._cmd_write, data) :]
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._next_message(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method} failed: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def wait_for(self, event: str, session: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            for i, message in enumerate(self._events):
                if message.get("method") == event and message.get("sessionId") == session:
                    return self._events.pop(i)
            self._events.append(self._next_message(deadline, event))

    def new_page(self) -> str:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        session_id = session["sessionId"]
        self.send("Page.enable", session=session_id)
        self.send("Runtime.enable", session=session_id)
        metrics = {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}
        self.send("Emulation.setDeviceMetricsOverride", metrics, session_id)
        return session_id

    def open(self, session: str, url: str) -> None:
        self._events = [m for m in self._events if m.get("sessionId") != session]
        result = self.send("Page.navigate", {"url": url}, session)
        if result.get("errorText"):
            raise RuntimeError(f"could not open {url}: {result['errorText']}")
        self.wait_for("Page.loadEventFired", session)

    def evaluate(self, session: str, expression: str):
        params = {"expression": expression, "awaitPromise": True, "returnByValue": True}
        result = self.send("Runtime.evaluate", params, session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, session: str, path: Path, max_height: int = 60000) -> None:
        """A full-page PNG: the viewport is made as tall as the page (the theme lays out its
        sticky sidebars for that window), given two frames to settle, then captured."""
        height = min(
            int(self.evaluate(session, "document.documentElement.scrollHeight")), max_height
        )
        metrics = {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.send("Emulation.setDeviceMetricsOverride", metrics, session)
        settle = "new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"
        self.evaluate(session, settle)
        data = self.send("Page.captureScreenshot", {"format": "png"}, session)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_write)


# What each checked page reports about itself, once its images have settled.
_PAGE_REPORT = """
(async () => {
  for (const img of document.images) img.loading = "eager";  // lazy images would never load
  await Promise.all(Array.from(document.images, (img) => img.complete ? null :
    new Promise((done) => {
      img.addEventListener("load", done);
      img.addEventListener("error", done);
    })));
  const h1 = document.querySelector("main h1, article h1, h1");
  return {
    title: document.title,
    h1: h1 ? h1.textContent.replace(/[#¶]\\s*$/, "").trim() : null,
    text: document.body.innerText,
    tracebacks: document.querySelectorAll(".traceback, .output.error").length,
    images: Array.from(document.images, (img) => ({
      src: img.getAttribute("src"), complete: img.complete,
      width: img.naturalWidth, height: img.naturalHeight,
      output: img.closest(".cell_output, .output") !== null })),
  };
})()
"""


def source_title(source: Path) -> str:
    """The H1 of a page's source: the first ``# `` line of the markdown (or first markdown cell)."""
    if source.suffix == ".ipynb":
        cells = json.loads(source.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = source.read_text()
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    raise AssertionError(f"{source} has no '# ' title line")


@pytest.fixture(scope="module")
def browser(site: Path):
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip(
            "the browser test needs Chromium: install Debian's `chromium` package "
            "(`make browser` does it when run as root)"
        )
    server = _Server(site)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        chromium = Chromium(executable, Path(profile))
        try:
            yield chromium, server
        finally:
            chromium.close()
            server.close()


@pytest.mark.parametrize(("page", "source", "has_plots"), PAGES, ids=[p[0] for p in PAGES])
def test_page_renders_in_chromium(browser, page: str, source: str, has_plots: bool) -> None:
    chromium, server = browser
    failed_before = len(server.failed)
    session = chromium.new_page()
    chromium.open(session, server.url + page)
    report = chromium.evaluate(session, _PAGE_REPORT)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / (page.replace("/", "__").removesuffix(".html") + ".png")
    chromium.screenshot(session, shot)

    title = source_title(ROOT / source)
    assert report["h1"] == title, f"{page}: expected the heading {title!r}, got {report['h1']!r}"
    assert title in report["title"], f"{page}: the browser tab title is {report['title']!r}"
    assert TRACEBACK not in report["text"] and report["tracebacks"] == 0, (
        f"{page} shows a Python traceback (screenshot: {shot.relative_to(ROOT)})"
    )
    bad = [img for img in report["images"] if not (img["complete"] and img["width"] > 0)]
    assert not bad, f"{page}: images that did not load: {bad}"
    plots = [img for img in report["images"] if img["output"]]
    if has_plots:
        assert plots, f"{page} should show plots, but no image sits in a cell output"
    failed = server.failed[failed_before:]
    assert not failed, f"{page}: requests the site could not answer: {failed}"
    assert shot.stat().st_size > 10_000, f"the screenshot {shot} looks empty"
