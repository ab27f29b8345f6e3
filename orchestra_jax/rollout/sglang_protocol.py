"""SGLang's native `/generate` wire format, in both directions.

The SGLang client (`sglang_client.py`) and our own rollout server (`server.py`)
speak the same JSON, so the conversions live here, once.

Request (token-in):

    {"input_ids": [1, 2, 3] | [[1, 2], [3]],
     "sampling_params": {...} | [{...}, {...}],
     "return_logprob": true}

Sampling fields are always sent explicitly, because SGLang's defaults come from
the model's generation config: temperature, top_p, top_k, max_new_tokens,
stop_token_ids, skip_special_tokens=false, no_stop_trim=true (keep the stop
token), and sampling_seed when the request has a seed.

Response (token-out), one object per prompt (a list when batched):

    {"text": "...", "output_ids": [...],
     "meta_info": {"id": ..., "prompt_tokens": n, "completion_tokens": m, "cached_tokens": c,
                   "finish_reason": {"type": "stop", "matched": 7} | {"type": "length", "length": m}
                                    | {"type": "abort", "message": "..."},
                   "output_token_logprobs": [[logprob, token_id, null], ...],
                   "e2e_latency": seconds}}
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from orchestra_jax.rollout.engine import Completion, GenerateRequest, SamplingParams

# Fields we accept because they are what a token-in/token-out client sends anyway;
# the values that change behaviour are checked in `sampling_from_json`.
_KNOWN_NEUTRAL = {"skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens"}
_SAMPLING_FIELDS = {
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "stop_token_ids",
    "sampling_seed",
}
# SGLang spells "all tokens" as a huge top_k.
_TOP_K_ALL = 1 << 30


def sampling_to_json(params: SamplingParams) -> dict[str, Any]:
    """SamplingParams -> SGLang `sampling_params`, every field explicit."""
    out = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    return out


def sampling_from_json(obj: Any) -> SamplingParams:
    """SGLang `sampling_params` -> SamplingParams; ValueError names the bad field."""
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise ValueError(f"sampling_params must be an object, got {type(obj).__name__}")
    unknown = set(obj) - _SAMPLING_FIELDS - _KNOWN_NEUTRAL
    if unknown:
        raise ValueError(f"unsupported sampling_params fields: {sorted(unknown)}")
    if obj.get("skip_special_tokens") is True or obj.get("no_stop_trim") is False:
        raise ValueError(
            "this server is token-out: send skip_special_tokens=false, no_stop_trim=true"
        )

    def number(name, default, kind):
        value = obj.get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"sampling_params.{name} must be a number, got {value!r}")
        if kind is int and value != int(value):
            raise ValueError(f"sampling_params.{name} must be an integer, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"sampling_params.{name} must be finite, got {value!r}")
        return kind(value)

    top_k = number("top_k", -1, int)
    stop = obj.get("stop_token_ids") or []
    if not isinstance(stop, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in stop
    ):
        raise ValueError(f"sampling_params.stop_token_ids must be a list of ints, got {stop!r}")
    seed = obj.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"sampling_params.sampling_seed must be an integer, got {seed!r}")
    return SamplingParams(
        temperature=number("temperature", 1.0, float),
        top_p=number("top_p", 1.0, float),
        top_k=-1 if top_k >= _TOP_K_ALL else top_k,
        max_new_tokens=number("max_new_tokens", 128, int),
        stop_token_ids=tuple(stop),
        seed=seed,
    )


def generate_payload(requests: Sequence[GenerateRequest]) -> dict[str, Any]:
    """One batched `/generate` body for `requests`."""
    payload = {
        "input_ids": [list(r.input_ids) for r in requests],
        "sampling_params": [sampling_to_json(r.sampling) for r in requests],
        "return_logprob": True,
    }
    if all(r.request_id is not None for r in requests):
        payload["rid"] = [r.request_id for r in requests]
    return payload


def parse_generate_payload(body: Any) -> tuple[list[GenerateRequest], bool, bool]:
    """A `/generate` body -> (requests, batched, return_logprob); ValueError if malformed."""
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    if body.get("stream"):
        raise ValueError("stream=true is not supported by this server")
    ids = body.get("input_ids")
    if ids is None:
        raise ValueError("input_ids is required (this server is token-in)")
    if not isinstance(ids, list) or not ids:
        raise ValueError("input_ids must be a non-empty list of ints or of int lists")
    batched = isinstance(ids[0], list)
    prompts = ids if batched else [ids]
    for prompt in prompts:
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
        ):
            raise ValueError(
                "every prompt in input_ids must be a non-empty list of non-negative ints"
            )
    sampling = body.get("sampling_params")
    if isinstance(sampling, list):
        if len(sampling) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling)} sampling_params")
        params = [sampling_from_json(s) for s in sampling]
    else:
        params = [sampling_from_json(sampling)] * len(prompts)
    rids = body.get("rid")
    if rids is None:
        rids = [None] * len(prompts)
    elif not batched:
        rids = [rids]
    if not isinstance(rids, list) or len(rids) != len(prompts):
        raise ValueError("rid must match input_ids (one id per prompt)")
    requests = [
        GenerateRequest(p, s, None if r is None else str(r))
        for p, s, r in zip(prompts, params, rids)
    ]
    return requests, batched, bool(body.get("return_logprob", False))


def finish_reason_json(completion: Completion) -> dict[str, Any]:
    """Our finish reason -> SGLang's `meta_info.finish_reason` object."""
    if completion.finish_reason == "stop":
        matched = completion.output_ids[-1] if completion.output_ids else None
        return {"type": "stop", "matched": matched}
    if completion.finish_reason == "length":
        return {"type": "length", "length": completion.completion_tokens}
    return {"type": "abort", "message": "aborted by the engine"}


def completion_to_json(
    completion: Completion, *, rid: str | None, text: str, return_logprob: bool
) -> dict[str, Any]:
    """A Completion -> one SGLang `/generate` response object."""
    meta = {
        "id": rid,
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "cached_tokens": completion.cached_tokens,
        "finish_reason": finish_reason_json(completion),
        "e2e_latency": completion.latency_s,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [
            [lp, tok, None] for lp, tok in zip(completion.logprobs, completion.output_ids)
        ]
    return {"text": text, "output_ids": list(completion.output_ids), "meta_info": meta}


def completion_from_json(obj: Any, *, latency_s: float) -> Completion:
    """One SGLang `/generate` response object -> Completion (tokens from the logprobs)."""
    try:
        meta = obj["meta_info"]
        pairs = meta["output_token_logprobs"]
        reason = meta["finish_reason"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"malformed /generate response, missing {e}: {str(obj)[:300]}") from None
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind not in ("stop", "length", "abort"):
        raise ValueError(f"unknown finish_reason {reason!r} in /generate response")
    output_ids = [int(p[1]) for p in pairs]
    # SGLang reports None for a logprob it could not compute; keep the slot (NaN) so
    # ids and logprobs stay aligned and the learner can see it.
    logprobs = [float("nan") if p[0] is None else float(p[0]) for p in pairs]
    return Completion(
        output_ids=output_ids,
        logprobs=logprobs,
        finish_reason=kind,
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=len(output_ids),
        latency_s=latency_s,
        cached_tokens=int(meta.get("cached_tokens", 0)),
    )
