"""A domain folder whose code came from a model, run in the sandbox: tau2 sees stand-ins.

`SandboxedDomain(folder)` starts `domain_server.py` in the domain-code sandbox
(`domain_sandbox.py`: bubblewrap, no network, its own pid namespace, the
folder read-only) and never imports the folder's code here. Its
`environment()` is a `SandboxedEnvironment`: an object with the methods of
tau2's `Environment` that the episode, the user and tau2's evaluator call
(`get_response`, `set_state`, `make_tool_call`, `get_db_hash`,
`run_env_assertion`, `get_policy`, `get_tools`, …), each a request to the
server, which holds the real environment. Registered in tau2's registry
(`tau2_domain_folder.register_domain_folder`), it is what tau2's evaluator
builds, so grading runs the domain's code in the sandbox too.

Requests go one at a time (a lock). A request that runs past `call_timeout_s`,
or a server that dies or answers with anything but the answer to that
request, kills the server: the request fails (a tool call gets tau2's
"Error: …" tool message, as a raising tool does), and the next request
starts a fresh server, on which each live stand-in first replays what built
its state (its `set_state` and its calls that succeeded; the synthesis
pipeline keeps only tasks whose gold actions replay to the same database).

The server runs the domain's code in its own process, so that code can write
on the answer channel; it can only misanswer calls of its own domain (whose
results it shapes anyway), and an answer out of step kills the server.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib
import select
import threading
import time
import weakref
from typing import Any

from orchestra_jax.envs import domain_sandbox
from orchestra_jax.envs.domain_server import MARKER
from orchestra_jax.tools.sandbox.base import SandboxLimits

MAX_ANSWER_BYTES = 64 * 1024 * 1024


class DomainCallFailed(RuntimeError):
    """A request to the sandboxed domain raised there, ran past its time, or got no answer."""


class OutOfStep(DomainCallFailed):
    """The answer channel held something other than the answer to the request (the domain's
    code wrote on it): the server is killed and the request tried once more on a fresh one."""


@dataclasses.dataclass(frozen=True)
class RemoteTool:
    """A domain tool as the trainer sees it: its name and OpenAI schema."""

    name: str
    openai_schema: dict[str, Any]


class SandboxedDomain:
    """The server of one domain folder (module docstring)."""

    def __init__(
        self,
        folder: str | os.PathLike,
        data_dir: str,
        *,
        sandbox: str = "auto",
        code_is_trusted: bool = False,
        call_timeout_s: float = 30.0,
        startup_s: float = 180.0,
        memory_mb: int = 4096,
        cpu_s: int = 36000,
    ):
        if not call_timeout_s > 0:
            raise ValueError(f"call_timeout_s must be > 0, got {call_timeout_s}")
        self.folder = pathlib.Path(folder).resolve()
        self.name = self.folder.name
        self.data_dir = os.path.abspath(data_dir)
        self.backend = domain_sandbox.domain_sandbox(sandbox, code_is_trusted=code_is_trusted)
        self.call_timeout_s, self.startup_s = call_timeout_s, startup_s
        self.limits = SandboxLimits(
            timeout_s=cpu_s, memory_mb=memory_mb, max_output_bytes=64 << 20, max_processes=64
        )
        self.starts = 0  # servers started (a restart follows each failure)
        self._process: domain_sandbox.SandboxedProcess | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._envs = itertools.count(1)
        self._freed: list[int] = []
        self._buffer = b""  # what the server wrote past the last answer read
        self._ready = False  # the server has said it is ready
        self._described: dict[str, Any] | None = None

    # --- what the trainer reads -----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """{"policy", "tools"} of the domain (asked once)."""
        described = self._described
        if described is None:
            with self._lock:
                described = self._described = self._request({"op": "describe"}, self.startup_s)
        return described

    def environment(self, db: Any = None, solo_mode: bool = False) -> SandboxedEnvironment:
        """tau2's `get_environment(db=None, solo_mode=False)`: a fresh stand-in."""
        if db is not None or solo_mode:
            raise ValueError(
                f"τ² domain {self.name!r} runs in the sandbox: no db= or solo mode there"
            )
        return SandboxedEnvironment(self)

    def close(self) -> None:
        with self._lock:
            self._stop()

    # --- requests -------------------------------------------------------------------------

    def call(self, stand_in: SandboxedEnvironment, request: dict[str, Any], *, log: bool) -> Any:
        """`request` on `stand_in`'s environment (rebuilt first on a fresh server); kept in
        its log when `log` and it succeeded."""
        for attempt in range(2):
            try:
                with self._lock:
                    if stand_in.generation != self.starts or self._process is None:
                        self._ensure_started()
                        stand_in.generation = self.starts
                        for earlier in [{"op": "new"}, *stand_in.log]:
                            self._request({**earlier, "env": stand_in.env}, self.call_timeout_s)
                    value = self._request({**request, "env": stand_in.env}, self.call_timeout_s)
                break
            except OutOfStep:
                if attempt:
                    raise
        if log:
            stand_in.log.append(request)
        return value

    def forget(self, env: int) -> None:
        """A stand-in is gone: its environment is freed with the next request."""
        self._freed.append(env)

    def _spawn(self) -> None:
        """Starts a server (it imports tau2 and the domain while the caller goes on)."""
        self._process = domain_sandbox.start_python_module(
            self.backend,
            "orchestra_jax.envs.domain_server",
            self.limits,
            read_only=[str(self.folder), self.data_dir],
            env={"TAU2_DATA_DIR": self.data_dir, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            args=[str(self.folder)],
        )
        self.starts += 1
        self._ready = False
        self._freed.clear()

    def _ensure_started(self) -> None:
        """A server that has said it is ready (started, or its start awaited, here)."""
        if self._process is None or self._process.proc.poll() is not None:
            self._stop()
            self._spawn()
        if not self._ready:
            answer = self._answer(0, self.startup_s)
            if "error" in answer:
                self._stop()
                raise DomainCallFailed(f"{self.folder}: the domain's code does not load: {answer}")
            self._ready = True

    def _request(self, request: dict[str, Any], timeout_s: float) -> Any:
        self._ensure_started()
        process = self._process
        assert process is not None and process.proc.stdin is not None
        if self._freed and request.get("op") != "free":
            freed, self._freed = self._freed, []
            self._request({"op": "free", "envs": freed}, timeout_s)
        request_id = next(self._ids)
        try:
            process.proc.stdin.write((json.dumps({**request, "id": request_id}) + "\n").encode())
            process.proc.stdin.flush()
            answer = self._answer(request_id, timeout_s)
        except BaseException:  # a failed or interrupted wait leaves the server out of step
            self._stop()
            self._spawn()  # the next request's server starts now
            raise
        if "error" in answer:
            raise DomainCallFailed(str(answer["error"]))
        return answer.get("value")

    def _answer(self, request_id: int, timeout_s: float) -> dict[str, Any]:
        """The server's answer to `request_id`; any other outcome kills it and raises
        (`OutOfStep` when the channel held anything but that one answer)."""
        process = self._process
        assert process is not None and process.proc.stdout is not None
        fd = process.proc.stdout.fileno()
        line = self._line(fd, time.monotonic() + timeout_s)
        if line is None:
            self._stop()
            raise DomainCallFailed(f"no answer within {timeout_s:g} s (the server is restarted)")
        text = line.decode("utf-8", errors="replace")
        problem = ""
        answer: Any = None
        if not text:
            problem = "the server ended"
        elif not text.startswith(MARKER):
            problem = "not an answer line"
        else:
            try:
                answer = json.loads(text[len(MARKER) :])
            except ValueError as e:
                problem = f"not JSON ({e})"
        if not problem and (not isinstance(answer, dict) or answer.get("id") != request_id):
            problem = f"not the answer to request {request_id}"
        if not problem and (self._buffer or select.select([fd], [], [], 0)[0]):
            problem = "more than one answer"
        if problem:
            tail = process.stderr_tail()
            self._stop()
            kind = DomainCallFailed if not text else OutOfStep
            raise kind(f"{problem}: {text[:200]!r}\n{tail}")
        return answer

    def _line(self, fd: int, deadline: float) -> bytes | None:
        """The next line the server wrote (b"" when it ended), None at the deadline. Short
        waits, so an interrupt (`tool_thread`) lands soon."""
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if select.select([fd], [], [], min(left, 0.1))[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return b""
                self._buffer += chunk
                if len(self._buffer) > MAX_ANSWER_BYTES:  # no answer is that long
                    line, self._buffer = self._buffer[:200], b""
                    return line
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _stop(self) -> None:
        self._buffer = b""
        if self._process is not None:
            self._process.close()
            self._process = None
            self.starts += 1  # stand-ins of the old server rebuild on the next one


class SandboxedEnvironment:
    """A stand-in for tau2's `Environment` of a sandboxed domain (module docstring)."""

    user_tools = None  # folder domains have no user tools
    solo_mode = False

    def __init__(self, domain: SandboxedDomain):
        self.domain = domain
        self.domain_name = domain.name
        self.env = next(domain._envs)
        self.generation = -1  # never built yet
        self.log: list[dict[str, Any]] = []
        weakref.finalize(self, domain.forget, self.env)

    def get_domain_name(self) -> str:
        return self.domain_name

    def get_policy(self) -> str:
        return self.domain.describe()["policy"]

    def get_tools(self) -> list[RemoteTool]:
        return [RemoteTool(s["function"]["name"], s) for s in self.domain.describe()["tools"]]

    def get_user_tools(self, include: Any = None) -> list[Any]:
        del include
        raise ValueError(f"τ² domain {self.domain_name!r} has no user tools")

    def set_state(
        self,
        initialization_data: Any,
        initialization_actions: Any,
        message_history: list[Any],
        **kwargs: Any,
    ) -> None:
        request = {
            "op": "set_state",
            "initialization_data": None
            if initialization_data is None
            else initialization_data.model_dump(mode="json"),
            "initialization_actions": None
            if initialization_actions is None
            else [a.model_dump(mode="json") for a in initialization_actions],
            "message_history": [m.model_dump(mode="json") for m in message_history],
            **({"strict": kwargs["strict"]} if "strict" in kwargs else {}),
        }
        self.domain.call(self, request, log=True)

    def get_response(self, message: Any) -> Any:
        """tau2's tool message for the call; a failed request is an error tool message."""
        from tau2.data_model.message import ToolMessage

        request = {"op": "get_response", "call": message.model_dump(mode="json")}
        try:
            return ToolMessage.model_validate(self.domain.call(self, request, log=True))
        except (DomainCallFailed, ValueError) as e:  # ValueError: not a tool message
            return ToolMessage(
                id=message.id,
                content=f"Error: {e}",
                requestor=message.requestor,
                role="tool",
                error=True,
            )

    def make_tool_call(self, tool_name: str, requestor: str = "assistant", **kwargs: Any) -> None:
        request = {
            "op": "make_tool_call",
            "tool_name": tool_name,
            "requestor": requestor,
            "arguments": kwargs,
        }
        self.domain.call(self, request, log=True)

    def get_db_hash(self) -> str | None:
        return self.domain.call(self, {"op": "get_db_hash"}, log=False)

    def get_user_db_hash(self) -> str | None:
        return self.domain.call(self, {"op": "get_user_db_hash"}, log=False)

    def run_env_assertion(self, assertion: Any, raise_assertion_error: bool = True) -> bool:
        request = {
            "op": "run_env_assertion",
            "assertion": assertion.model_dump(mode="json"),
            "raise_assertion_error": raise_assertion_error,
        }
        return bool(self.domain.call(self, request, log=False))

    def sync_tools(self) -> None:
        """tau2 calls it after each tool call; the server's environment does its own."""
