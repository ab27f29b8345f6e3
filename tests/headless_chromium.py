"""Drive a headless Chromium from a test over the Chrome DevTools Protocol (CDP).

The browser is the system's (Debian: `apt-get install chromium`), started with
`--remote-debugging-port=0`; the test talks to one page over its websocket
(`websocket-client`, in the `test` extra). Input goes through CDP's `Input`
domain (mouse clicks at an element's centre, key presses, inserted text), so the
page sees the events a user's would give it.

    with Chromium.start() as browser:
        page = browser.page()
        page.navigate("http://127.0.0.1:8000/")
        page.click("#submit")
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_binary() -> str | None:
    """$CHROMIUM, else the first of BINARIES on PATH; None where there is none."""
    named = os.environ.get("CHROMIUM")
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(RuntimeError):
    """A CDP command answered with an error, or a page script threw."""


class Page:
    """One page target: send commands, read events, evaluate scripts, give input."""

    def __init__(self, ws_url: str, timeout_s: float = 30.0):
        import websocket  # websocket-client

        # Chromium refuses websocket handshakes carrying an Origin it was not told
        # to allow (--remote-allow-origins); this client sends none.
        self._ws = websocket.create_connection(ws_url, timeout=timeout_s, suppress_origin=True)
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.send("Page.enable")
        self.send("Runtime.enable")

    def close(self) -> None:
        self._ws.close()

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Run one CDP command; its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        command_id = self._next_id
        self._ws.send(json.dumps({"id": command_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == command_id:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def evaluate(self, expression: str, *, await_promise: bool = False) -> Any:
        """The value of a script expression in the page (JSON-serialisable values)."""
        result = self.send(
            "Runtime.evaluate",
            expression=expression,
            returnByValue=True,
            awaitPromise=await_promise,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"page script failed: {text}")
        return result["result"].get("value")

    def navigate(self, url: str, timeout_s: float = 30.0) -> None:
        """Load `url` and wait until its document is complete."""
        self.send("Page.navigate", url=url)
        self.wait_for(
            "document.readyState === 'complete' && location.href !== 'about:blank'", timeout_s
        )

    def wait_for(self, expression: str, timeout_s: float = 30.0, interval_s: float = 0.02) -> Any:
        """Poll `expression` until it is truthy; its value, or TimeoutError."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s} s for {expression!r} in the page")
            time.sleep(interval_s)

    def box(self, selector: str) -> dict[str, float]:
        """The element's bounding box in CSS pixels, scrolled into view."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return {x: r.left, y: r.top, width: r.width, height: r.height}; })()"
        )
        if box is None:
            raise CDPError(f"no element matches {selector!r}")
        return box

    def click(self, selector: str, *, at_fraction: float = 0.5) -> None:
        """A left mouse click on the element, `at_fraction` of its width from its left
        edge (the middle by default), at half its height."""
        box = self.box(selector)
        x = box["x"] + box["width"] * at_fraction
        y = box["y"] + box["height"] / 2
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type_text(self, selector: str, text: str) -> None:
        """Click into the field, select what it holds, and type `text` over it."""
        self.click(selector)
        self.evaluate(f"document.querySelector({json.dumps(selector)}).select()")
        self.send("Input.insertText", text=text)

    def press(self, key: str, code: int) -> None:
        """A key press (down, then up) on the focused element, e.g. ("ArrowRight", 39)."""
        for kind in ("rawKeyDown", "keyUp"):
            self.send(
                "Input.dispatchKeyEvent",
                type=kind,
                key=key,
                code=key,
                windowsVirtualKeyCode=code,
                nativeVirtualKeyCode=code,
            )


class Chromium:
    """A headless Chromium process with a throwaway profile."""

    def __init__(self, binary: str, process: subprocess.Popen, home: str, port: int):
        self.binary = binary
        self.process = process
        self.home = home  # the profile and Chromium's stderr.log
        self.port = port
        self._pages: list[Page] = []

    @classmethod
    def start(cls, binary: str | None = None, timeout_s: float = 30.0) -> Chromium:
        binary = binary or find_binary()
        if binary is None:
            raise FileNotFoundError("no Chromium binary (set $CHROMIUM or install chromium)")
        home = tempfile.mkdtemp(prefix="headless-chromium-")
        profile = os.path.join(home, "profile")
        log_path = os.path.join(home, "stderr.log")
        args = [
            binary,
            "--headless",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-dev-shm-usage",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1280,1000",
            "about:blank",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium's own sandbox refuses to run as root
        with open(log_path, "wb") as log:
            process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        # Chromium writes the port it took into the profile once it listens.
        port_file = pathlib.Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                stderr = pathlib.Path(log_path).read_text(errors="replace")[-2000:]
                shutil.rmtree(home, ignore_errors=True)
                raise RuntimeError(
                    f"{binary} opened no DevTools port within {timeout_s} s"
                    f" (exit status {process.returncode}): {stderr}"
                )
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        return cls(binary, process, home, port)

    def page(self) -> Page:
        """A new tab's page."""
        with urllib.request.urlopen(
            urllib.request.Request(
                f"http://127.0.0.1:{self.port}/json/new?about:blank", method="PUT"
            ),
            timeout=10,
        ) as response:
            target = json.load(response)
        page = Page(target["webSocketDebuggerUrl"])
        self._pages.append(page)
        return page

    def close(self) -> None:
        for page in self._pages:
            with contextlib.suppress(Exception):
                page.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
