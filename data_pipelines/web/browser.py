"""A minimal headless-Chromium driver over the DevTools protocol, standard library only.

Chromium is started once with ``--remote-debugging-pipe``: it reads JSON commands from file descriptor 3 and
writes replies and events to descriptor 4, each message terminated by a NUL byte (the transport Puppeteer and
Playwright use; protocol reference: https://chromedevtools.github.io/devtools-protocol/). No websocket, no
port, no third-party package.

Isolation and determinism:
- a fresh ``--user-data-dir`` per browser (deleted on close), software rendering, scale factor 1, no scrollbars;
- network off: every http(s)/ws request goes to a dead proxy and DNS resolves nothing, so only ``file://`` and
  ``data:`` content loads; pages are written to a private temporary folder and opened as ``file://``;
- ``<meta http-equiv="refresh">`` is neutralised in the source before loading (it would navigate away, even to
  other local files, at a racy moment);
- page JavaScript is disabled (``Emulation.setScriptExecutionDisabled``): pages are static HTML+CSS, and a
  candidate page cannot loop forever; the driver's own ``Runtime.evaluate`` calls still run;
- CSS animations, transitions and the caret are switched off after load.

One :class:`ChromiumBrowser` serves many pages (one tab, navigated again for each page); a crashed or hung
browser is restarted by the next :meth:`ChromiumBrowser.load_html` after a :class:`RenderError`.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTALL_HINT = (
    "Chromium was not found. Install Debian's Chromium with `bash scripts/install_chromium.sh` "
    "(runs `apt-get install -y chromium`), or point KVL_CHROMIUM at a Chromium/Chrome executable."
)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BASE_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-breakpad",
    "--disable-dev-shm-usage",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    "--force-color-profile=srgb",
    "--font-render-hinting=none",
    "--proxy-server=http://127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--remote-debugging-pipe",
)
FREEZE_CSS = (
    "*,*::before,*::after{animation:none!important;transition:none!important;caret-color:transparent!important;"
    "scroll-behavior:auto!important}"
)


_META_REFRESH = re.compile(r"http-equiv\s*=\s*([\"']?)\s*refresh", re.IGNORECASE)


def neutralise_refresh(html: str) -> str:
    """Rename ``http-equiv=refresh`` so the page cannot navigate itself away (layout is unaffected)."""
    return _META_REFRESH.sub(r"http-equiv=\1kvl-refresh-disabled", html)


class ChromiumNotFoundError(RuntimeError):
    """No Chromium executable on this machine; the message says how to install one."""


class RenderError(RuntimeError):
    """A page could not be rendered (timeout, browser crash, protocol error)."""


def find_chromium(executable: str | None = None) -> str:
    """Path of the Chromium executable: ``executable``, else ``$KVL_CHROMIUM``, else the first on ``PATH``."""
    candidate = executable or os.environ.get("KVL_CHROMIUM")
    if candidate:
        path = shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)
        if path is None:
            raise ChromiumNotFoundError(f"Chromium executable {candidate!r} does not exist. {INSTALL_HINT}")
        return path
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise ChromiumNotFoundError(INSTALL_HINT)


@dataclass(frozen=True)
class Viewport:
    """CSS-pixel viewport (device scale factor 1, so CSS pixels = screenshot pixels)."""

    width: int = 512
    height: int = 384

    def __post_init__(self) -> None:
        if not (16 <= self.width <= 4096 and 16 <= self.height <= 16384):
            raise ValueError(f"viewport must be 16..4096 wide and 16..16384 high, got {self.width}x{self.height}")


class _Pipe:
    """NUL-delimited JSON messages over two pipes, with a deadline on every read."""

    def __init__(self, write_fd: int, read_fd: int) -> None:
        self.write_fd, self.read_fd = write_fd, read_fd
        self.buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self.write_fd, data) :]

    def receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.read_fd], [], [], remaining)[0]:
                raise RenderError("timed out waiting for Chromium")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise RenderError("Chromium closed the DevTools pipe (crashed or exited)")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        for fd in (self.write_fd, self.read_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class ChromiumBrowser:
    """One headless Chromium process with one tab; reuse it for many pages (a warm start costs ~0.5 s).

    Example::

        with ChromiumBrowser() as browser:
            browser.load_html("<h1>Hi</h1>", Viewport(512, 384))
            png = browser.screenshot()
    """

    def __init__(
        self,
        executable: str | None = None,
        timeout_s: float = 20.0,
        start_timeout_s: float = 120.0,
        start_attempts: int = 2,
    ) -> None:
        if timeout_s <= 0 or start_timeout_s <= 0 or start_attempts < 1:
            raise ValueError(
                f"need timeout_s > 0, start_timeout_s > 0 and start_attempts >= 1, got {timeout_s}, "
                f"{start_timeout_s}, {start_attempts}"
            )
        self.executable = find_chromium(executable)
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.start_attempts = start_attempts
        self._process: subprocess.Popen | None = None
        self._pipe: _Pipe | None = None
        self._session: str | None = None
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self._profile_dir: str | None = None
        self._page_dir = tempfile.mkdtemp(prefix="kvl-pages-")
        self._page_count = 0
        self._owner_pid = os.getpid()

    def __enter__(self) -> ChromiumBrowser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the browser process and open the tab (no-op when already running).

        A cold first start can take many seconds (16 s seen on a fresh 2-core machine, the binary and fonts still
        uncached; more with the cores busy), so starting has its own ``start_timeout_s`` and is tried
        ``start_attempts`` times. The error after the last attempt quotes the end of Chromium's stderr.
        """
        if self.alive and self._session is not None:
            return
        for attempt in range(1, self.start_attempts + 1):
            try:
                self._start_once()
                return
            except RenderError as error:
                log = self._stderr_tail()
                self._stop_process()
                if attempt == self.start_attempts:
                    raise RenderError(
                        f"Chromium ({self.executable}) did not start: {error} (tried {attempt} times, "
                        f"{self.start_timeout_s:g} s each); the end of its stderr:\n{log}"
                    ) from error

    def _stderr_path(self) -> Path:
        return Path(self._page_dir) / "chromium-stderr.log"

    def _stderr_tail(self, lines: int = 12) -> str:
        try:
            text = self._stderr_path().read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no stderr captured)"
        return "\n".join(text.strip().splitlines()[-lines:]) or "(empty)"

    def _start_once(self) -> None:
        self._stop_process()
        self._profile_dir = tempfile.mkdtemp(prefix="kvl-chromium-profile-")
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()

        def _wire_fds() -> None:
            # Move both ends above 4 first, so that neither dup2 overwrites the other.
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        args = [self.executable, *BASE_FLAGS, f"--user-data-dir={self._profile_dir}", "about:blank"]
        with open(self._stderr_path(), "wb") as stderr:
            self._process = subprocess.Popen(
                args, pass_fds=(3, 4), preexec_fn=_wire_fds, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=stderr,
            )
        os.close(to_child_r)
        os.close(from_child_w)
        self._pipe = _Pipe(to_child_w, from_child_r)
        self._events.clear()
        wait = self.start_timeout_s
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False, timeout_s=wait)["targetId"]
        attached = self.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, session=False, timeout_s=wait
        )
        self._session = attached["sessionId"]
        self.call("Page.enable", timeout_s=wait)
        self.call("Emulation.setScriptExecutionDisabled", {"value": True}, timeout_s=wait)

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: bool = True,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Send one protocol command and return its ``result``; raise :class:`RenderError` on error or after
        ``timeout_s`` (default: the browser's ``timeout_s``)."""
        if self._pipe is None:
            raise RenderError("browser is not started")
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        self._pipe.send(message)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            try:
                reply = self._pipe.receive(deadline)
            except RenderError as error:
                raise RenderError(f"{error} (command {method})") from None
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RenderError(f"{method} failed: {reply['error'].get('message', reply['error'])}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def wait_event(self, name: str) -> dict[str, Any]:
        """Wait for the next protocol event called ``name`` on the tab's session."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == name and event.get("sessionId") == self._session:
                    del self._events[: i + 1]
                    return event.get("params", {})
            self._events.append(self._pipe.receive(deadline))

    def evaluate(self, expression: str) -> Any:
        """Evaluate a JavaScript expression in the page (driver code runs even though page scripts do not)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RenderError(f"evaluation failed: {result['exceptionDetails'].get('text', 'exception')}")
        return result.get("result", {}).get("value")

    def set_viewport(self, viewport: Viewport) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": viewport.width, "height": viewport.height, "deviceScaleFactor": 1, "mobile": False},
        )

    def load_html(self, html: str, viewport: Viewport) -> None:
        """Write ``html`` to a private file, open it as ``file://`` at ``viewport`` and wait for its load event.

        Restarts the browser if it died. Raises :class:`RenderError` on timeout or navigation failure.
        """
        if not isinstance(html, str):
            raise ValueError(f"html must be str, got {type(html).__name__}")
        try:
            self._load(html, viewport)
        except RenderError:
            self._stop_process()
            raise

    def _load(self, html: str, viewport: Viewport) -> None:
        self.start()
        self._page_count += 1
        path = Path(self._page_dir) / f"page{self._page_count % 2}.html"
        path.write_text(neutralise_refresh(html), encoding="utf-8")
        self.set_viewport(viewport)
        self._events.clear()
        result = self.call("Page.navigate", {"url": path.as_uri()})
        if result.get("errorText"):
            raise RenderError(f"navigation failed: {result['errorText']}")
        self.wait_event("Page.loadEventFired")
        self.evaluate(
            "(()=>{const s=document.createElement('style');s.id='kvl-freeze';"
            f"s.textContent={json.dumps(FREEZE_CSS)};document.documentElement.appendChild(s);}})()"
        )

    def content_height(self) -> int:
        """Height of the laid-out document in CSS pixels."""
        return int(
            self.evaluate(
                "Math.ceil(Math.max(document.documentElement.scrollHeight,"
                " document.body ? document.body.scrollHeight : 0))"
            )
        )

    def screenshot(self) -> bytes:
        """PNG bytes of the current viewport."""
        data = self.call("Page.captureScreenshot", {"format": "png", "fromSurface": True})["data"]
        return base64.b64decode(data)

    def _stop_process(self) -> None:
        if os.getpid() != self._owner_pid:  # a forked child: forget the parent's browser, never stop it
            self._process, self._pipe, self._session, self._profile_dir = None, None, None, None
            self._page_dir, self._owner_pid = tempfile.mkdtemp(prefix="kvl-pages-"), os.getpid()
            return
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
            self._process = None
        self._session = None
        if self._profile_dir is not None:
            shutil.rmtree(self._profile_dir, ignore_errors=True)
            self._profile_dir = None

    def close(self) -> None:
        """Stop the browser and delete its profile and page folders (only in the process that created it)."""
        self._stop_process()
        if os.getpid() == self._owner_pid:
            shutil.rmtree(self._page_dir, ignore_errors=True)
