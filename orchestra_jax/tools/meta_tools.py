"""Meta-tools: a model alias does the work, in the role of the tool's table entry.

Each takes one argument, `model`, naming an alias of the task's `ToolConfig`;
the alias's backend (an `ExpertClient` in `Backends.experts`) does the model
work in its role (`meta_tool_table.META_TOOLS`). How the expert is asked and
how its reply is read (prompt, temperature, query, program, answer, whether an
empty answer ends the episode) is `Backends.expert_protocol`'s
(`tools/experts/protocols.py`, `tools.experts`), given the backend's model family
(`Backends.families`). The entry's `result` picks what becomes of the reply;
the paper's three:

  search:            the expert writes a query; the retriever returns
                     `search_top_k` documents (restricted to the task's
                     `metadata["allowed_doc_ids"]` when present), appended to
                     ctx.documents and listed in metadata["documents"].
                     cost = tokens + the search's charge (`tools/retrieval/search_pricing.py`:
                     price_per_query + n_docs * price_per_doc by default)
                     latency = expert latency + measured retrieval time*
  enhance_reasoning: the expert writes a program; the sandbox runs it; the
                     output is appended to ctx.notes (metadata "code", "output",
                     "stdout").
                     cost = tokens + seconds* * code_price_per_s
                     latency = expert latency + measured execution time*
  answer:            the expert answers; `ToolResult.final_answer` holds the
                     extracted answer and the episode ends (an empty one ends
                     it where the protocol says so; otherwise it is an error).
                     cost = tokens; latency = expert latency
  ("reply":          the expert's reply is the observation.
                     cost = tokens; latency = expert latency)

where tokens = (prompt_tokens * price_in + completion_tokens * price_out) / 1e6
with the alias's prices, and * marks measured wall time, charged only where
`Backends.charge_measured_time` is set (offline runs leave it out, so that
their rewards do not depend on machine load). A bad alias or a failing
backend returns a `ToolResult` with `error` set (and whatever was already
spent); where the failure is a service's, not the policy's (an expert endpoint
that failed after its client's retries, the search backend failing
`Backends.search_retries` + 1 times), the result also carries its
`infra_failure` (`orchestra_jax/infra_failure.py`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from orchestra_jax.infra_failure import InfraError, InfraFailure, endpoint_of, is_service_failure
from orchestra_jax.tools import descriptions, pricing
from orchestra_jax.tools.base import ToolContext, ToolResult, error_result
from orchestra_jax.tools.experts.client import ExpertError, ExpertReply, backoff_delay
from orchestra_jax.tools.experts.protocols import ExpertProtocol
from orchestra_jax.tools.function_tools import format_sandbox_result
from orchestra_jax.tools.meta_tool_table import META_TOOLS, MetaToolSpec

SEARCH_BACKOFF_S = 1.0  # The first wait before a failed search is tried again (doubling).


class MetaTool:
    """Alias resolution and expert calling; the expert's reply is the observation.

    Subclasses turn the reply into something else (`finish`). `name` and `role`
    come from the tool's table entry.
    """

    def __init__(self, tool_config: Any, backends: Any, spec: MetaToolSpec):
        self.config, self.backends, self.spec = tool_config, backends, spec
        self.name, self.role = spec.name, spec.role

    def schema(self) -> dict[str, Any]:
        return descriptions.meta_tool_schema(self.name, self.config.aliases_for(self.name))

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        alias = arguments.get("model")
        choices = [a.alias for a in self.config.aliases_for(self.name)]
        if alias not in choices:
            return error_result(
                f"{self.name}: argument 'model' must be one of {choices}, got {alias!r}",
                tool=self.name,
            )
        spec = self.config.alias(alias)
        expert = self.backends.experts.get(spec.backend)
        if expert is None:
            return error_result(
                f"{self.name}: no backend {spec.backend!r} for {alias}", tool=self.name, model=alias
            )
        family = self.backends.families.get(spec.backend, "")
        messages, temperature = self.expert_request(ctx, family)
        tools = self.expert_tools(ctx)
        try:
            reply = await expert.complete(
                messages,
                max_tokens=self.backends.expert_max_tokens,
                temperature=temperature,
                ctx=ctx,
                **({} if tools is None else {"tools": tools}),
            )
        except ExpertError as e:  # retried by the client already: not the policy's failure
            result = error_result(
                str(e), tool=self.name, model=alias, backend=spec.backend, expert_failed=True
            )
            result.infra_failure = InfraFailure(
                kind="expert", endpoint=e.endpoint or spec.backend, message=str(e)
            )
            return result
        meta = {
            "tool": self.name,
            "model": alias,
            "backend": spec.backend,
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
        }
        cost = pricing.token_cost(
            reply.prompt_tokens, reply.completion_tokens, spec.price_in, spec.price_out
        )
        try:
            return await self.finish(reply, ctx, cost, meta, family)
        except Exception as e:  # a failing backend is an observation
            return ToolResult(
                text=f"Error: {self.name} failed: {e}",
                error=f"{type(e).__name__}: {e}",
                cost_usd=cost,
                latency_s=reply.latency_s,
                metadata=meta,
                infra_failure=e.failure if isinstance(e, InfraError) else None,
            )

    @property
    def protocol(self) -> ExpertProtocol:
        return self.backends.expert_protocol

    def expert_request(self, ctx: ToolContext, family: str) -> tuple[list[dict[str, Any]], float]:
        """What the expert of `family` reads, and its sampling temperature: the protocol's."""
        return self.protocol.request(self.role, family, ctx, self.backends.expert_temperature)

    def expert_tools(self, ctx: ToolContext) -> list[dict[str, Any]] | None:
        """Function schemas the expert may call in its reply (OpenAI `tools`); None:
        a plain chat request."""
        del ctx
        return None

    async def finish(
        self,
        reply: ExpertReply,
        ctx: ToolContext,
        cost: float,
        meta: dict[str, Any],
        family: str = "",
    ) -> ToolResult:
        del ctx, family
        return ToolResult(text=reply.text, cost_usd=cost, latency_s=reply.latency_s, metadata=meta)


class SearchTool(MetaTool):
    """result "documents": the reply is a query; the retrieved documents are the result."""

    async def finish(self, reply, ctx, cost, meta, family=""):
        del family
        if self.backends.retriever is None:
            raise RuntimeError("no retriever configured")
        query = self.protocol.query(reply.text, ctx.task.question)
        charged = self.protocol.charged_query(reply.text, ctx.task.question)
        start = time.monotonic()
        docs = await self.retrieve(query, ctx)
        retrieval_s = self.backends.charged_seconds(time.monotonic() - start)
        shown = [d.render(self.config.document_text) for d in docs]
        for text in shown:
            if text not in ctx.documents:
                ctx.documents.append(text)
        lines = [f"Query: {query}"] + [f"[{i + 1}] {text}" for i, text in enumerate(shown)]
        if not docs:
            lines.append("No documents found.")
        # The documents as the orchestrator read them: the "rebuild" context reads them.
        meta.update(query=query, doc_ids=[d.id for d in docs], documents=shown)
        return ToolResult(
            text="\n".join(lines),
            cost_usd=cost + self.backends.search_charge.cost(charged, len(docs), self.config),
            latency_s=reply.latency_s + retrieval_s,
            metadata=meta,
        )

    async def retrieve(self, query: str, ctx: ToolContext) -> list[Any]:
        """The retriever's documents, tried `Backends.search_retries` + 1 times while it
        fails as a service does (`is_service_failure`, or any `OSError`: a connection,
        a file of the index); `InfraError` (kind "search") when every attempt fails.
        Any other exception (a query the retriever rejects, a bug) is raised at once:
        the call's error, which the policy reads, never an outage that hides it."""
        retriever, retries = self.backends.retriever, self.backends.search_retries
        last_error = "no attempt made"
        for attempt in range(retries + 1):
            if attempt:
                await asyncio.sleep(backoff_delay(attempt - 1, SEARCH_BACKOFF_S, 30.0))
            try:
                return await asyncio.to_thread(
                    retriever.search,
                    query,
                    self.config.search_top_k,
                    ctx.task.metadata.get("allowed_doc_ids"),
                )
            except Exception as e:
                if not (isinstance(e, OSError) or is_service_failure(e)):
                    raise
                last_error = f"{type(e).__name__}: {e}"
        raise InfraError(
            f"search backend failed after {retries + 1} attempt(s); last error: {last_error}",
            kind="search",
            endpoint=endpoint_of(retriever),
        )


class EnhanceReasoningTool(MetaTool):
    """result "code": the reply is a program; the sandbox runs it."""

    async def finish(self, reply, ctx, cost, meta, family=""):
        del family
        code = self.protocol.code(reply.text)
        result = await asyncio.to_thread(
            self.backends.run_code,
            code,
            timeout_s=self.protocol.code_timeout_s(self.config.code_timeout_s),
        )
        output = format_sandbox_result(result)
        note = self.protocol.note(code, result)
        if note is not None:
            ctx.notes.append(note)
        meta.update(
            code=code,
            output=output,
            # What the program printed, as printed (the release's exec_result: nothing
            # when the run hit its time limit), for `agent.rebuild.programs="stdout"`.
            stdout="" if result.timed_out else result.stdout,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            code_seconds=result.duration_s,
        )
        seconds = self.backends.charged_seconds(result.duration_s)
        return ToolResult(
            text=f"```python\n{code.strip()}\n```\nOutput:\n{output}",
            cost_usd=cost + pricing.code_cost(seconds, self.config.code_price_per_s),
            latency_s=reply.latency_s + seconds,
            metadata=meta,
        )


class AnswerTool(MetaTool):
    """result "answer": the reply's final answer ends the episode."""

    async def finish(self, reply, ctx, cost, meta, family=""):
        final = self.protocol.answer(reply.text, family)
        if not final and not self.protocol.empty_answer_ends:
            return ToolResult(
                text="Error: the answer model gave no answer",
                error="empty answer",
                cost_usd=cost,
                latency_s=reply.latency_s,
                metadata=meta,
            )
        return ToolResult(
            text=reply.text,
            cost_usd=cost,
            latency_s=reply.latency_s,
            metadata=meta,
            final_answer=final,
        )


TOOL_OF_RESULT = {
    "documents": SearchTool,
    "code": EnhanceReasoningTool,
    "answer": AnswerTool,
    "reply": MetaTool,
}


def make_meta_tool(name: str, tool_config: Any, backends: Any) -> MetaTool:
    """The meta-tool `name` (a `META_TOOLS` entry) for one task's config and backends."""
    spec = META_TOOLS.get(name)
    return TOOL_OF_RESULT[spec.result](tool_config, backends, spec)
