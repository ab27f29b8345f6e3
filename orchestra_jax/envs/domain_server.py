"""The process that runs a domain folder's model-written code, inside the sandbox.

`python -m orchestra_jax.envs.domain_server <folder>` is started by
`sandboxed_domain.py` in the domain-code sandbox (`domain_sandbox.py`: no
network, its own pid namespace, the folder and the installation read-only,
an empty environment). It imports tau2 and the folder's `data_model.py` and
`tools.py`, then holds tau2 environments of the domain by id and answers one
JSON request a line on stdin with one line `MARKER` + JSON on its stdout
(whatever the domain code prints goes to stderr):

  describe                     {"policy", "tools": [OpenAI schemas]}
  new {env}                    a fresh environment (`db.json` read afresh)
  free {envs}                  forgets environments
  set_state {env, initialization_data, initialization_actions, message_history, strict}
  get_response {env, call}     tau2's tool message for a tool call
  make_tool_call {env, tool_name, requestor, arguments}
  get_db_hash / get_user_db_hash {env}
  run_env_assertion {env, assertion, raise_assertion_error}

Each answer is `{"id", "value"}`, or `{"id", "error"}` when the call raised (the
caller raises it again). Pydantic objects travel as their JSON dumps.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import traceback
from typing import Any

MARKER = "@@domain-answer@@ "


class Server:
    """The environments of one domain folder (module docstring)."""

    def __init__(self, folder: pathlib.Path):
        from orchestra_jax.envs.tau2.domain_code import environment_constructor, load_domain_code

        db_class, toolkit_class = load_domain_code(folder)
        self.make = environment_constructor(folder, db_class, toolkit_class)
        self.environments: dict[int, Any] = {}

    def handle(self, request: dict[str, Any]) -> Any:
        from pydantic import TypeAdapter
        from tau2.data_model.message import Message, ToolCall
        from tau2.data_model.tasks import EnvAssertion, EnvFunctionCall, InitializationData

        op = request["op"]
        if op == "describe":
            environment = self.make()
            return {
                "policy": environment.get_policy(),
                "tools": [t.openai_schema for t in environment.get_tools()],
            }
        if op == "new":
            self.environments[int(request["env"])] = self.make()
            return None
        if op == "free":
            for env in request["envs"]:
                self.environments.pop(int(env), None)
            return None
        environment = self.environments[int(request["env"])]
        if op == "set_state":
            data = request["initialization_data"]
            actions = request["initialization_actions"]
            history = request["message_history"]
            environment.set_state(
                initialization_data=None if data is None else InitializationData(**data),
                initialization_actions=None
                if actions is None
                else [EnvFunctionCall(**a) for a in actions],
                message_history=TypeAdapter(list[Message]).validate_python(history),
                **({"strict": request["strict"]} if "strict" in request else {}),
            )
            return None
        if op == "get_response":
            return environment.get_response(ToolCall(**request["call"])).model_dump(mode="json")
        if op == "make_tool_call":
            environment.make_tool_call(
                request["tool_name"], requestor=request["requestor"], **request["arguments"]
            )
            return None
        if op == "get_db_hash":
            return environment.get_db_hash()
        if op == "get_user_db_hash":
            return environment.get_user_db_hash()
        if op == "run_env_assertion":
            return environment.run_env_assertion(
                EnvAssertion(**request["assertion"]),
                raise_assertion_error=request["raise_assertion_error"],
            )
        raise ValueError(f"unknown request {op!r}")


def main(argv: list[str]) -> None:
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # fd 1 is stderr from here on
    with contextlib.redirect_stdout(sys.stderr):
        from orchestra_jax.envs.tau2.setup import import_tau2

        import_tau2()
        try:
            server = Server(pathlib.Path(argv[0]))
            ready: dict[str, Any] = {"id": 0, "value": "ready"}
        except Exception as e:
            server, ready = None, {"id": 0, "error": f"{type(e).__name__}: {e}"}
        out.write(MARKER + json.dumps(ready) + "\n")
        out.flush()
        if server is None:
            return
        for line in sys.stdin:
            if not line.strip():
                continue
            request_id = None
            try:
                request = json.loads(line)
                request_id = request["id"]
                answer = {"id": request_id, "value": server.handle(request)}
            except Exception as e:
                answer = {"id": request_id, "error": f"{type(e).__name__}: {e}"}
                traceback.print_exc()
            out.write(MARKER + json.dumps(answer, default=str) + "\n")
            out.flush()


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("--")])
