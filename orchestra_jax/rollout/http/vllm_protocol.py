"""vLLM's OpenAI completions wire format, token-in/token-out (client side).

Request, one prompt per `POST /v1/completions` (each request has its own seed):

    {"prompt": [ids], "max_tokens": m, "temperature": T, "top_p": p, "top_k": k | -1,
     "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty",
     "stop_token_ids": [...], "stop": [...], "seed": s, "ignore_eos": true,
     "skip_special_tokens": false, "include_stop_str_in_output": true,
     "logprobs": n, "return_token_ids": true, "return_tokens_as_token_ids": true,
     "prompt_logprobs": n (only when the prompt is scored), "request_id": rid}

Response:

    {"choices": [{"token_ids": [...], "finish_reason": "stop" | "length" | "abort",
                  "stop_reason": id | "str" | null,
                  "logprobs": {"token_logprobs": [...], "tokens": ["token_id:7", ...],
                               "top_logprobs": [{"token_id:7": lp, ...}, ...]},
                  "prompt_token_ids": [...],
                  "prompt_logprobs": [null, {"<id>": {"logprob": lp, "rank": r}, ...}, ...]}],
     "usage": {"prompt_tokens": n, "completion_tokens": m,
               "prompt_tokens_details": {"cached_tokens": c} | null}}

Every sampling field is sent explicitly (vLLM's defaults come from the model's
generation config); only the request's stop ids end it (`ignore_eos`), as in
JaxEngine; special tokens are kept. `logprobs` is the number of top tokens
besides the sampled one (0: the sampled token's alone). Log-probabilities follow
`engine.py`'s convention when the server runs with `--logprobs-mode
processed_logprobs` (launch/vllm_server.sh) and the request has no top-p/top-k
cut; with a cut, vLLM's are those of the cut, renormalised distribution.
vLLM refuses `max_tokens` 0: a request for no new tokens (to score its prompt)
asks for one and drops it.
"""

from __future__ import annotations

from typing import Any

from orchestra_jax.rollout.engine import SEED_SPACE, Completion, GenerateRequest, TopLogprobs
from orchestra_jax.rollout.http.sglang_protocol import MalformedResponse

INT64 = 2**63
TOKEN_PREFIX = "token_id:"  # vLLM's name of a token with return_tokens_as_token_ids


def completion_payload(
    request: GenerateRequest, request_id: str, *, model: str | None = None
) -> dict[str, Any]:
    """The /v1/completions body for one request; `model` names the served model or LoRA
    adapter (None: the server's first, its base)."""
    s = request.sampling
    payload: dict[str, Any] = {
        "prompt": list(request.input_ids),
        "max_tokens": max(s.max_new_tokens, 1),
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,
        "min_p": s.min_p,
        "repetition_penalty": s.repetition_penalty,
        "frequency_penalty": s.frequency_penalty,
        "presence_penalty": s.presence_penalty,
        "stop_token_ids": list(s.stop_token_ids),
        "stop": list(s.stop),
        "ignore_eos": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "logprobs": request.top_logprobs_num,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "request_id": request_id,
    }
    if model is not None:
        payload["model"] = model
    if s.seed is not None:  # vLLM's seeds are signed 64-bit
        payload["seed"] = s.seed - SEED_SPACE if s.seed >= INT64 else s.seed
    if request.logprob_start_len >= 0:
        payload["prompt_logprobs"] = request.top_logprobs_num
    return payload


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _logprob(value: Any, where: str) -> float:
    """A log-probability from the wire: a number (vLLM clamps -inf to -9999)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedResponse(f"{where}: log-probability {value!r} is not a number")
    logprob = float(value)
    if logprob != logprob or logprob > 0.0:
        raise MalformedResponse(f"{where}: log-probability {logprob} is not a probability's")
    return logprob


def _token(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedResponse(f"{where}: token id {value!r} is not a non-negative integer")
    return value


def _token_name(name: Any, where: str) -> int:
    """ "token_id:7" -> 7."""
    if not isinstance(name, str) or not name.startswith(TOKEN_PREFIX):
        raise MalformedResponse(f"{where}: token {name!r} is not '{TOKEN_PREFIX}<id>'")
    try:
        return _token(int(name[len(TOKEN_PREFIX) :]), where)
    except ValueError:
        raise MalformedResponse(f"{where}: token {name!r} is not '{TOKEN_PREFIX}<id>'") from None


def _list(value: Any, where: str, length: int | None = None) -> list:
    if not isinstance(value, list):
        raise MalformedResponse(f"{where} is {_kind(value)}, not a list")
    if length is not None and len(value) != length:
        raise MalformedResponse(f"{where} has {len(value)} entries for {length} tokens")
    return value


def _top(row: Any, where: str) -> TopLogprobs:
    if not isinstance(row, dict):
        raise MalformedResponse(f"{where} is {_kind(row)}, not an object")
    pairs = [(_token_name(k, where), _logprob(v, f"{where}[{k!r}]")) for k, v in row.items()]
    return sorted(pairs, key=lambda p: -p[1])


def _prompt_scores(
    choice: dict, prompt: list[int], start: int, top: int
) -> tuple[list[float | None], list[TopLogprobs | None] | None]:
    """Prompt logprobs from position `start` on (None at position 0), and top tokens."""
    rows = _list(choice.get("prompt_logprobs"), "prompt_logprobs", len(prompt))
    scores: list[float | None] = []
    tops: list[TopLogprobs | None] = []
    for i in range(start, len(prompt)):
        row, where = rows[i], f"prompt_logprobs[{i}]"
        if i == 0 and row is None:
            scores.append(None)
            tops.append(None)
            continue
        if not isinstance(row, dict) or str(prompt[i]) not in row:
            raise MalformedResponse(f"{where} is {str(row)[:80]}, without token {prompt[i]}")
        entry = row[str(prompt[i])]
        value = entry.get("logprob") if isinstance(entry, dict) else None
        scores.append(_logprob(value, where))
        ranked = [(k, v) for k, v in row.items() if isinstance(v, dict) and v.get("rank", 0) <= top]
        tops.append(
            sorted(
                ((_token(int(k), where), _logprob(v.get("logprob"), where)) for k, v in ranked),
                key=lambda p: -p[1],
            )[:top]
        )
    return scores, (tops if top else None)


def completion_from_json(body: Any, request: GenerateRequest, *, latency_s: float) -> Completion:
    """One /v1/completions reply -> Completion; MalformedResponse for anything off the
    format (a missing field, token ids and log-probs that disagree, an unknown finish)."""
    try:
        [choice] = body["choices"]
        reason = choice["finish_reason"]
        token_ids = _list(choice["token_ids"], "token_ids")
        logprobs = choice["logprobs"]
        usage = body.get("usage") or {}
    except (KeyError, TypeError, ValueError) as e:
        raise MalformedResponse(
            f"malformed /v1/completions reply ({type(e).__name__}: {e}): {str(body)[:300]}"
        ) from None
    if reason not in ("stop", "length", "abort"):
        raise MalformedResponse(f"unknown finish_reason {reason!r} in /v1/completions reply")
    output_ids = [_token(t, f"token_ids[{i}]") for i, t in enumerate(token_ids)]
    if not isinstance(logprobs, dict):
        raise MalformedResponse(f"logprobs is {_kind(logprobs)}, not an object")
    n = len(output_ids)
    values = _list(logprobs.get("token_logprobs"), "logprobs.token_logprobs", n)
    names = _list(logprobs.get("tokens"), "logprobs.tokens", n)
    for i, (name, token) in enumerate(zip(names, output_ids)):
        if _token_name(name, f"logprobs.tokens[{i}]") != token:
            raise MalformedResponse(f"logprobs.tokens[{i}] is {name!r} but token_ids[{i}] {token}")
    scores = [_logprob(v, f"logprobs.token_logprobs[{i}]") for i, v in enumerate(values)]
    top = None
    if request.top_logprobs_num:
        rows = _list(logprobs.get("top_logprobs"), "logprobs.top_logprobs", n)
        top = [
            _top(row, f"logprobs.top_logprobs[{i}]")[: request.top_logprobs_num]
            for i, row in enumerate(rows)
        ]
    if request.sampling.max_new_tokens == 0:  # asked for one token only to score the prompt
        output_ids, scores, top, reason = [], [], [] if top is not None else None, "length"
    prompt = list(request.input_ids)
    prompt_logprobs = prompt_top = None
    if request.logprob_start_len >= 0:
        prompt_logprobs, prompt_top = _prompt_scores(
            choice, prompt, request.logprob_start_len, request.top_logprobs_num
        )
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    stop = choice.get("stop_reason")
    return Completion(
        output_ids=output_ids,
        logprobs=scores,
        finish_reason=reason,
        prompt_tokens=len(prompt),
        completion_tokens=len(output_ids),
        latency_s=latency_s,
        cached_tokens=int(cached or 0),
        matched_stop=stop if reason == "stop" and isinstance(stop, (int, str)) else None,
        top_logprobs=top,
        prompt_logprobs=prompt_logprobs,
        prompt_top_logprobs=prompt_top,
    )
