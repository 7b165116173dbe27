"""Headless Chromium over the DevTools protocol: open a page, run script, press keys, take a screenshot.

Owns finding a Chromium binary (`find_chromium`) and a minimal client of the DevTools protocol
(`Browser`) over ``--remote-debugging-pipe``: the browser reads commands on its file descriptor 3 and
writes answers and events on 4, one JSON message each, NUL-terminated. Standard library only: no
WebDriver, no websocket package, no browser download (Debian's ``chromium`` package is enough).
Used by tests/test_explore_browser.py and ``orl explore --screenshot``.
Does not own: the page or what a test asserts about it.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
INSTALL_HINT = ("install it (Debian/Ubuntu: `apt-get install -y --no-install-recommends chromium`, or "
                "`ORL_BROWSER=1 ./scripts/setup.sh` as root) or point ORL_CHROMIUM at a Chromium binary")
_KEYS = {"ArrowRight": 39, "ArrowLeft": 37, "ArrowUp": 38, "ArrowDown": 40, "Home": 36, "End": 35, " ": 32}


def find_chromium() -> str | None:
    """$ORL_CHROMIUM (a path or a command name), else the first of `CANDIDATES` on PATH, else None."""
    env = os.environ.get("ORL_CHROMIUM")
    if env:
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else shutil.which(env)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium and one page (tab) in it. Use as a context manager.

    ``open(url)`` loads a page and waits for it; ``evaluate(js)`` returns the expression's value
    (JSON-serialisable values); ``key(name)`` sends a real key press through the browser's input
    pipeline; ``screenshot(path)`` writes a PNG of the whole page; ``exceptions`` lists uncaught
    script errors the page raised."""

    def __init__(self, binary: str | None = None, width: int = 1360, height: int = 900, timeout: float = 30.0):
        binary = binary or find_chromium()
        if binary is None:
            raise FileNotFoundError(f"Chromium not found (looked for $ORL_CHROMIUM, {', '.join(CANDIDATES)}); "
                                    + INSTALL_HINT)
        self.timeout, self.width, self.height = timeout, width, height
        self._profile = tempfile.mkdtemp(prefix="orl-chromium-")
        to_browser_r, self._w = os.pipe()      # our commands -> its fd 3
        self._r, from_browser_w = os.pipe()    # its fd 4 -> our answers
        args = [binary, "--headless", "--remote-debugging-pipe", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-sync", "--disable-component-update", "--disable-dev-shm-usage", "--mute-audio",
                "--hide-scrollbars", f"--window-size={width},{height}", f"--user-data-dir={self._profile}"]
        if os.geteuid() == 0:  # Chromium's sandbox refuses to run as root
            args.append("--no-sandbox")

        # in the child, before exec: the pipe ends at 3 and 4 (via high numbers, so neither overwrites the
        # other). preexec_fn is Python between fork and exec; it only calls fcntl/dup2 (async-signal-safe)
        def fds():
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(a, 3)  # inheritable: the only descriptors besides 0-2 the browser gets
            os.dup2(b, 4)

        # close_fds=False: subprocess would close 3 and 4 after preexec_fn; Python's descriptors are
        # non-inheritable by default (PEP 446), so the browser inherits nothing else
        try:
            self.proc = subprocess.Popen(args + ["about:blank"], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=fds,
                                         close_fds=False)
        except OSError:
            for fd in (self._r, self._w):
                os.close(fd)
            shutil.rmtree(self._profile, ignore_errors=True)
            raise
        finally:
            os.close(to_browser_r)
            os.close(from_browser_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.exceptions: list[str] = []
        self.session: str | None = None

    # ---------------------------------------------------------------- the wire
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"Chromium did not answer within {self.timeout:g} s")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited (code {self.proc.poll()}) before answering")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = "page") -> dict:
        """One DevTools command; its result. ``session`` "page": the opened page's, None: the browser's."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        sid = self.session if session == "page" else session
        if sid:
            msg["sessionId"] = sid
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise BrowserError(f"{method}: {m['error'].get('message')}")
                return m.get("result", {})
            self._event(m)

    def _event(self, m: dict) -> None:
        self.events.append(m)
        if m.get("method") == "Runtime.exceptionThrown":
            d = m["params"]["exceptionDetails"]
            self.exceptions.append(d.get("exception", {}).get("description") or d.get("text", "?"))

    # ---------------------------------------------------------------- the page
    def open(self, url: str, ready: str = "document.readyState === 'complete'") -> None:
        """Open ``url`` in a new tab and wait until the ``ready`` expression is true."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=None)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=None)["sessionId"]
        self.send("Runtime.enable")
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False})
        self.send("Page.navigate", {"url": url})
        deadline = time.monotonic() + self.timeout
        while not self.evaluate(f"Boolean({ready})"):
            if time.monotonic() > deadline:
                raise BrowserError(f"{url} did not become ready ({ready}) within {self.timeout:g} s")
            time.sleep(0.02)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise BrowserError(f"script error: {d.get('exception', {}).get('description') or d.get('text')}")
        return r.get("result", {}).get("value")

    def key(self, key: str, shift: bool = False) -> None:
        """Press and release ``key`` ("ArrowRight", "Home", ...) as a user would."""
        code = _KEYS[key]
        base = {"key": key, "code": "Space" if key == " " else key, "windowsVirtualKeyCode": code,
                "nativeVirtualKeyCode": code, "modifiers": 8 if shift else 0}
        self.send("Input.dispatchKeyEvent", {"type": "rawKeyDown", **base})
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    def screenshot(self, path: str, full_page: bool = True) -> bytes:
        """Write a PNG of the page (the whole page when ``full_page``) to ``path``; its bytes."""
        params: dict = {"format": "png"}
        if full_page:  # the page's own height (not the window's), its whole width
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            height = self.evaluate("Math.ceil(document.body.getBoundingClientRect().height)") or size["height"]
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": size["width"],
                                                           "height": height, "scale": 1})
        png = base64.b64decode(self.send("Page.captureScreenshot", params)["data"])
        with open(path, "wb") as f:
            f.write(png)
        return png

    # ---------------------------------------------------------------- lifetime
    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.send("Browser.close", session=None)
                except (BrowserError, OSError):
                    pass
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        finally:
            for fd in (self._r, self._w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def screenshot(html_path: str, png_path: str, forward: int = 0, width: int = 1360) -> None:
    """Render the explorer page at ``html_path`` at slider position ``forward`` and save a PNG."""
    with Browser(width=width) as b:
        b.open("file://" + os.path.abspath(html_path), ready="window.orlExplore !== undefined")
        b.evaluate(f"window.orlExplore.set({int(forward)})")
        b.screenshot(png_path)
        if b.exceptions:
            raise BrowserError("the page raised: " + "; ".join(b.exceptions))
