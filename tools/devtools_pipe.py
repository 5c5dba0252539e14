"""A headless chromium driven through its DevTools pipe, to act on a page as a reader does.

``--dump-dom`` shows what a page looks like once loaded; it cannot type. With
``--remote-debugging-pipe`` chromium reads DevTools protocol commands (JSON, each ended by a NUL byte)
from its file descriptor 3 and writes answers and events to 4. This module opens those two pipes, so a
check can load a page, click, type and read the DOM back with nothing installed beyond chromium and
the standard library (no websocket client, no browser-automation package).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from typing import Any


class DevToolsError(RuntimeError):
    """The browser answered a command with an error, closed its pipe, or did not answer in time."""


class Browser:
    """One headless chromium process and its DevTools pipe; use as a context manager.

    Args:
        command: The browser and its flags (``--remote-debugging-pipe`` is added).
        timeout: Seconds one command may take before :class:`DevToolsError`.
    """

    def __init__(self, command: list[str], timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        self._buffer = b""
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # bash puts the pipe ends on the descriptors chromium expects (3: commands in, 4: answers out)
        wrapper = f'exec "$0" "$@" 3<&{to_browser_read} 4>&{from_browser_write}'
        self.process = subprocess.Popen(
            ["bash", "-c", wrapper, command[0], *command[1:], "--remote-debugging-pipe"],
            pass_fds=(to_browser_read, from_browser_write),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ask the browser to quit; kill it if it has not within five seconds."""
        try:
            self._write({"id": self._new_id(), "method": "Browser.close"})
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _write(self, message: dict[str, Any]) -> None:
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DevToolsError(f"no answer from the browser within {self.timeout:.0f} s")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    raise DevToolsError(f"the browser closed its DevTools pipe (exit {self.process.poll()})")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Run one DevTools command and return its result; events read meanwhile go to ``events``."""
        message: dict[str, Any] = {"id": self._new_id(), "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._write(message)
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == message["id"]:
                if "error" in answer:
                    raise DevToolsError(f"{method}: {answer['error'].get('message', answer['error'])}")
                return answer.get("result", {})
            if "method" in answer:
                self.events.append(answer)

    def open(self, url: str) -> str:
        """Open ``url`` in a new tab and return the DevTools session attached to it."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Runtime.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        return session

    def evaluate(self, session: str, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=session,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise DevToolsError(f"{expression!r} threw: {details.get('exception', {}).get('description', details)}")
        return result.get("result", {}).get("value")

    def wait_for(self, session: str, expression: str, seconds: float) -> Any:
        """Evaluate ``expression`` every 0.2 s until it is truthy (returned) or ``seconds`` pass (None).

        An evaluation that fails meanwhile (the page is still navigating) counts as not yet."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                value = self.evaluate(session, expression)
            except DevToolsError:
                value = None
            if value or time.monotonic() > deadline:
                return value or None
            time.sleep(0.2)

    def click(self, session: str, selector: str) -> None:
        """Click the middle of the first element matching ``selector``, as a mouse would."""
        box = self.evaluate(
            session,
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()",
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
                session=session,
            )

    def type(self, session: str, text: str) -> None:
        """Type ``text`` into the focused element, one key at a time (keydown, input, keyup)."""
        for character in text:
            self.send("Input.dispatchKeyEvent", {"type": "keyDown", "text": character, "key": character}, session)
            self.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": character}, session)

    def exceptions(self) -> list[str]:
        """The uncaught JavaScript exceptions the pages reported so far, one line each."""
        found = []
        for event in self.events:
            if event.get("method") == "Runtime.exceptionThrown":
                details = event["params"]["exceptionDetails"]
                found.append(details.get("exception", {}).get("description", details.get("text", "")).splitlines()[0])
        return found
