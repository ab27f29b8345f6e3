"""SGLang's native `/generate` wire format, both directions, with SGLang 0.5.23's rules.

The SGLang client (`rollout/http/sglang_client.py`) and our own rollout server (`server.py`)
speak the same JSON, so the conversions live here, once. The server side
(`parse_generate`) gives every request the verdict SGLang 0.5.23 gives it, in
SGLang's order (tests/test_rollout_sglang_conformance.py runs SGLang's own
validation on a table of requests and compares):

  1. the JSON contract: field types (`input_ids` ints, `rid` strings,
     `max_new_tokens` an integer, ...), unknown `sampling_params` fields refused,
     unknown top-level fields ignored;
  2. `GenerateReqInput` normalisation: text or input_ids, single or batch, `n`
     parallel samples, `rid` per prompt (unique), per-prompt logprob settings;
  3. the context check: prompt < context, prompt + max_new_tokens <= context;
  4. `SamplingParams` rules: temperature >= 0 (below 1e-6 greedy), top_p in (0, 1],
     top_k -1 or >= 1, min_p in [0, 1], penalties in range, at most 32 stop
     strings (and a tokenizer to match them), 64-bit sampling_seed.

Beyond SGLang, bounds from the model and this server (SGLang would fail later,
or not check): prompt ids inside the vocabulary, at most `max_batch_prompts`
prompts per request (after `n`), at most `max_top_logprobs` top logprobs. What
this server cannot do (grammars, images, sessions, min_new_tokens, an adapter
it does not hold, ...) is refused with a message naming the field. Values that cannot mean more than the
model allows are bounded, not refused, as SGLang does: a top_k past the
vocabulary keeps all of it; stop ids outside the vocabulary can never match.

Request (token-in):

    {"input_ids": [1, 2, 3] | [[1, 2], [3]], "text": "..." | [...],
     "sampling_params": {...} | [{...}, {...}], "rid": "a" | ["a", "b"],
     "return_logprob": true | [...], "top_logprobs_num": 0, "logprob_start_len": -1,
     "lora_path": "policy-v3" | [...] (the served LoRA adapter's name; absent: none),
     "stream": false}

Response, one object per prompt (a list when batched or n > 1):

    {"text": "...", "output_ids": [...],
     "meta_info": {"id": rid, "finish_reason": {"type": "stop", "matched": 7 | "str"}
                     | {"type": "length", "length": m} | {"type": "abort", "message": ...},
                   "prompt_tokens": n, "completion_tokens": m, "cached_tokens": c,
                   "weight_version": "3", "e2e_latency": s,
                   "input_token_logprobs": [[logprob | null, id, text | null], ...],
                   "output_token_logprobs": [[logprob, id, text | null], ...],
                   "input_top_logprobs": [...], "output_top_logprobs": [...]}}

The client always sends every sampling field explicitly (SGLang's defaults come
from the model's generation config), `ignore_eos: true` (only the request's stop
ids end it, as in JaxEngine), `skip_special_tokens: false` and `no_stop_trim: true`.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

from orchestra_jax.rollout.engine import Completion, GenerateRequest, SamplingParams

TOP_K_ALL = 1 << 30  # SGLang's "the whole vocabulary"
MAX_STOP_STRINGS = 32  # SGLang's limit
GREEDY_BELOW = 1e-6  # SGLang samples greedily below this temperature
INT64 = 2**63
SEED_SPACE = 2**64  # SGLang's signed 64-bit seeds, as our unsigned ones

# SGLang's sampling_params fields (any other is refused, as SGLang's contract does).
SAMPLING_FIELDS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty")
_INT_FIELDS = ("max_new_tokens", "top_k", "min_new_tokens", "n", "stream_interval", "beam_width")
_BOOL_FIELDS = (
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
)
# Sampling fields this server cannot honour, with the value that means "unused".
_UNSUPPORTED_SAMPLING = {
    "stop_regex": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": {},
    "custom_params": None,
    "beam_width": None,
    "watermark": None,
    "choice": [],
    "min_new_tokens": 0,
}
# Top-level fields this server cannot honour (any value but null / false / empty).
_UNSUPPORTED_TOP = (
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "token_ids_logprob",
    "return_hidden_states",
    "return_routed_experts",
    "return_sampling_mask",
    "session_params",
    "session_id",
    "custom_logit_processor",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "max_thinking_tokens",
    "return_flat_raw_top_logprobs",
    "return_flat_raw_output_top_logprobs",
    "positional_embed_overrides",
)


class RequestError(ValueError):
    """A request the server refuses: `status` is the HTTP code (400, 413, ...), `param`
    the field at fault when one is."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What the model and the server allow (the bounds requests are checked against)."""

    vocab_size: int
    context_len: int  # prompt + generated tokens, at most (the engine's max_seq_len)
    eos_token_ids: tuple[int, ...] = ()  # end generation unless ignore_eos
    max_batch_prompts: int = 1024  # prompts per /generate, after n
    max_top_logprobs: int = 20
    can_decode: bool = False  # a tokenizer: stop strings, text prompts and text out


@dataclasses.dataclass
class WireItem:
    """One prompt of a /generate call, ready for the engine, and how to answer it."""

    request: GenerateRequest
    rid: str
    return_logprob: bool
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    adapter: str | None = None  # the LoRA adapter the request names (lora_path)


@dataclasses.dataclass
class GenerateCall:
    """A parsed /generate body."""

    items: list[WireItem]
    batched: bool  # answer with a list
    stream: bool
    return_text_in_logprobs: bool = False
    return_prompt_token_ids: bool = False


# -- the JSON contract (types) -----------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value[:50]}"'
    return "sequence" if isinstance(value, list) else "map"


def _bad_type(path: str, value: Any, expected: str) -> RequestError:
    return RequestError(f"{path}: invalid type: {_kind(value)}, expected {expected}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_int(path: str, v: Any) -> None:
    if not _is_int(v):
        raise _bad_type(path, v, "i64")
    if not -INT64 <= v < INT64:
        raise RequestError(f"{path}: integer {v} does not fit 64 bits")


def _check_one_or_list(path: str, value: Any, check: Callable[[str, Any], None]) -> None:
    if isinstance(value, list):
        for i, v in enumerate(value):
            check(f"{path}[{i}]", v)
    else:
        check(path, value)


def _check_optional_str(path: str, v: Any) -> None:
    if v is not None:
        _check_str(path, v)


def _check_str(path: str, v: Any) -> None:
    if not isinstance(v, str):
        raise _bad_type(path, v, "a string")


def _check_bool(path: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise _bad_type(path, v, "a boolean")


def _check_token_ids(path: str, value: Any) -> None:
    """A flat list of ints, or a list of such lists (ints or lists decide, as SGLang's)."""
    if not isinstance(value, list):
        raise _bad_type(path, value, "a sequence of token ids or of token-id sequences")
    if not value or _is_number(value[0]):
        for i, t in enumerate(value):
            _check_int(f"{path}[{i}]", t)
        return
    for i, row in enumerate(value):
        if not isinstance(row, list):
            raise _bad_type(f"{path}[{i}]", row, "a sequence")
        for j, t in enumerate(row):
            _check_int(f"{path}[{i}][{j}]", t)


def _check_sampling(path: str, sp: Any) -> None:
    if not isinstance(sp, dict):
        raise _bad_type(path, sp, "struct SamplingParams")
    for key, v in sp.items():
        where = f"{path}.{key}"
        if key not in SAMPLING_FIELDS:
            raise RequestError(f"{path}: unknown field `{key}`, expected one of {SAMPLING_FIELDS}")
        if v is None:
            continue
        if key in _FLOAT_FIELDS or key == "repetition_penalty":
            if not _is_number(v):
                raise _bad_type(where, v, "f64")
        elif key in _INT_FIELDS or key == "sampling_seed":
            _check_int(where, v)
        elif key in _BOOL_FIELDS:
            _check_bool(where, v)
        elif key in ("stop", "stop_regex"):
            _check_one_or_list(where, v, _check_str)
        elif key == "stop_token_ids":
            if not isinstance(v, list):
                raise _bad_type(where, v, "a sequence")
            for i, t in enumerate(v):
                _check_int(f"{where}[{i}]", t)
        elif key in ("json_schema", "regex", "ebnf", "structural_tag"):
            _check_str(where, v)


def check_contract(body: Any) -> None:
    """RequestError unless `body` has SGLang's /generate JSON types."""
    if not isinstance(body, dict):
        raise _bad_type("body", body, "struct GenerateRequest")
    checks = {
        "rid": lambda p, v: _check_one_or_list(p, v, _check_str),
        "text": lambda p, v: _check_one_or_list(p, v, _check_str),
        "input_ids": _check_token_ids,
        "stream": _check_bool,
        "return_logprob": lambda p, v: _check_one_or_list(p, v, _check_bool),
        "logprob_start_len": lambda p, v: _check_one_or_list(p, v, _check_int),
        "top_logprobs_num": lambda p, v: _check_one_or_list(p, v, _check_int),
        "return_text_in_logprobs": _check_bool,
        "sampling_params": lambda p, v: _check_one_or_list(p, v, _check_sampling),
        "return_prompt_token_ids": _check_bool,
        "lora_path": lambda p, v: _check_one_or_list(p, v, _check_optional_str),
    }
    for key, check in checks.items():
        value = body.get(key)
        if value is not None:
            check(key, value)


def check_supported(body: dict) -> None:
    """RequestError naming the first field this server cannot honour."""
    for key in _UNSUPPORTED_TOP:
        if body.get(key) not in (None, False, [], {}):
            raise RequestError(f"{key} is not supported by this server")
    params = body.get("sampling_params")
    for sp in params if isinstance(params, list) else [params or {}]:
        for key, unused in _UNSUPPORTED_SAMPLING.items():
            if sp.get(key) is not None and sp.get(key) != unused:
                raise RequestError(f"sampling_params.{key} is not supported by this server")


# -- normalisation (GenerateReqInput) and per-prompt rules (SamplingParams) ---------------------


def _per_prompt(body: dict, key: str, default: Any, count: int, n: int) -> list:
    value = body.get(key)
    if value is None:
        return [default] * count
    if not isinstance(value, list):
        return [value] * count
    if n > 1:
        raise RequestError(f"Cannot use list {key} with parallel_sample_num > 1")
    if len(value) != count:
        raise RequestError(f"{key} has {len(value)} entries for {count} prompts")
    return value


def sampling_params_from_json(
    sp: dict, prompt_len: int, limits: ServerLimits, *, explicit_max_new: bool = True
) -> SamplingParams:
    """One prompt's SGLang sampling_params -> SamplingParams, with SGLang's checks.

    RequestError names the bad value. The context rule (SGLang's tokenizer
    manager): the prompt leaves room for a token, and an explicit max_new_tokens
    fits beside it; without one, generation may fill the context (SGLang's
    default 128, capped there).
    """
    get = lambda key, default: default if sp.get(key) is None else sp[key]  # noqa: E731
    context = limits.context_len
    if prompt_len >= context:
        raise RequestError(
            f"The input ({prompt_len} tokens) is longer than the model's context length "
            f"({context} tokens)."
        )
    max_new = sp.get("max_new_tokens")
    if max_new is not None and max_new + prompt_len > context:
        raise RequestError(
            "Requested token count exceeds the model's maximum context length of "
            f"{context} tokens. You requested a total of {max_new + prompt_len} tokens: "
            f"{prompt_len} tokens from the input messages and {max_new} tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the "
            "completion to fit within the limit."
        )
    temperature = float(get("temperature", 1.0))
    top_k = int(get("top_k", TOP_K_ALL))
    if 0 <= temperature < GREEDY_BELOW:
        temperature = 0.0  # greedy: top-k, top-p and min-p change nothing
    if top_k == -1:
        top_k = TOP_K_ALL
    top_p, min_p = float(get("top_p", 1.0)), float(get("min_p", 0.0))
    frequency = float(get("frequency_penalty", 0.0))
    presence = float(get("presence_penalty", 0.0))
    repetition = float(get("repetition_penalty", 1.0))
    if not math.isfinite(temperature) or temperature < 0.0:
        raise RequestError(f"temperature must be a non-negative finite number, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise RequestError(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise RequestError(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1:
        raise RequestError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if not -2.0 <= frequency <= 2.0:
        raise RequestError(f"frequency_penalty must be in [-2, 2], got {frequency}.")
    if not -2.0 <= presence <= 2.0:
        raise RequestError(f"presence_penalty must be in [-2, 2], got {presence}.")
    if not 0.0 < repetition <= 2.0:
        raise RequestError(
            f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {repetition}."
        )
    if max_new is not None and max_new < 0:
        raise RequestError(f"max_new_tokens must be at least 0, got {max_new}.")
    stop = get("stop", [])
    stop = [stop] if isinstance(stop, str) else list(stop)
    if len(stop) > MAX_STOP_STRINGS:
        raise RequestError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stop)}")
    if stop and not limits.can_decode:
        raise RequestError(
            f"stop={stop!r} is unavailable on a server without a tokenizer (it decodes "
            "tokens to text to match them)"
        )
    stop_ids = set(get("stop_token_ids", []))
    if not get("ignore_eos", False):
        stop_ids |= set(limits.eos_token_ids)
    seed = sp.get("sampling_seed")
    room = context - prompt_len
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=-1 if top_k >= min(TOP_K_ALL, limits.vocab_size) else top_k,
        min_p=min_p,
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        presence_penalty=presence,
        max_new_tokens=room if max_new is None else max_new,
        # An id outside the vocabulary is never generated: it can never match.
        stop_token_ids=tuple(sorted(t for t in stop_ids if 0 <= t < limits.vocab_size)),
        stop=tuple(s for s in stop if s),
        seed=None if seed is None else seed % SEED_SPACE,
    )


def parse_generate(
    body: Any,
    limits: ServerLimits,
    encode: Callable[[str], list[int]] | None = None,
    adapters: Collection[str] = (),
) -> GenerateCall:
    """A /generate body -> GenerateCall, or RequestError with SGLang's verdict and message.

    `encode` tokenises text prompts (None: a server without a tokenizer); `adapters`:
    the LoRA adapters the server serves, by name (a `lora_path` naming another is
    refused).
    """
    check_contract(body)
    check_supported(body)
    if body.get("input_ids") is not None:
        prompts, single = body["input_ids"], None
        if not prompts:
            raise RequestError("input_ids cannot be empty.")
        single = _is_int(prompts[0])
        prompts = [prompts] if single else prompts
    elif body.get("text") is not None:
        if encode is None:
            raise RequestError(
                "This server was started without a tokenizer and cannot accept text prompts. "
                "Please provide input_ids."
            )
        text = body["text"]
        single = isinstance(text, str)
        prompts = [encode(t) for t in ([text] if single else text)]
    else:
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    count = len(prompts)
    params = body.get("sampling_params")
    if isinstance(params, list):
        if single:
            raise RequestError("sampling_params must be one object for a single prompt")
        if len(params) != count:
            raise RequestError(f"{count} prompts but {len(params)} sampling_params")
        ns = {sp.get("n") or 1 for sp in params}
        if len(ns) > 1:
            raise RequestError(
                "The parallel_sample_num should be the same for all samples in sample params."
            )
        n = ns.pop()
    else:
        params = [params or {}] * count
        n = params[0].get("n") or 1
    if n < 1:
        raise RequestError(f"n must be at least 1, got {n}")
    batched = not single or n > 1
    total = count * n
    if total > limits.max_batch_prompts:
        raise RequestError(
            f"{total} prompts (after n) exceed this server's limit of "
            f"{limits.max_batch_prompts} per request",
            status=413,
        )
    rids = _rids(body.get("rid"), count, n, single)
    return_logprob = _per_prompt(body, "return_logprob", False, count, n)
    start_len = _per_prompt(body, "logprob_start_len", -1, count, n)
    top_num = _per_prompt(body, "top_logprobs_num", 0, count, n)
    named = _per_prompt(body, "lora_path", None, count, n)
    for name in named:
        if name is not None and name not in adapters:
            raise RequestError(
                f"lora_path {name!r} is not loaded on this server (loaded: {sorted(adapters)})"
            )
    items = []
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise RequestError(f"prompt {i} is empty")
        bad = [t for t in prompt if not 0 <= t < limits.vocab_size]
        if bad:
            raise RequestError(
                f"prompt {i} has token ids {bad[:5]} outside the vocabulary "
                f"[0, {limits.vocab_size})"
            )
        sp = params[i]
        sampling = sampling_params_from_json(sp, len(prompt), limits)
        want_top, start = int(top_num[i]), int(start_len[i])
        if not return_logprob[i]:
            want_top, start = 0, -1  # SGLang ignores both without return_logprob
        if want_top < 0:
            raise RequestError(f"top_logprobs_num must be >= 0, got {want_top}")
        if want_top > limits.max_top_logprobs:
            raise RequestError(
                f"top_logprobs_num must be at most {limits.max_top_logprobs} on this server, "
                f"got {want_top}"
            )
        if start > len(prompt):
            raise RequestError(
                f"logprob_start_len={start} is higher than the number of input tokens "
                f"{len(prompt)}. Please use a smaller logprob_start_len."
            )
        for sample in range(n):
            seed = sampling.seed
            if seed is not None and n > 1:  # parallel samples differ
                seed = (seed + sample) % SEED_SPACE
            request = GenerateRequest(
                list(prompt),
                dataclasses.replace(sampling, seed=seed),
                rids[i][sample],
                top_logprobs_num=want_top,
                logprob_start_len=max(start, -1),
            )
            items.append(
                WireItem(
                    request,
                    rids[i][sample],
                    bool(return_logprob[i]),
                    skip_special_tokens=bool(sp.get("skip_special_tokens", True) is not False),
                    no_stop_trim=bool(sp.get("no_stop_trim") or False),
                    adapter=named[i],
                )
            )
    return GenerateCall(
        items,
        batched,
        bool(body.get("stream") or False),
        return_text_in_logprobs=bool(body.get("return_text_in_logprobs") or False),
        return_prompt_token_ids=bool(body.get("return_prompt_token_ids") or False),
    )


def _rids(rid: Any, count: int, n: int, single: bool) -> list[list[str]]:
    """Per prompt, one request id per sample (SGLang gives parallel samples fresh ones)."""
    if n > 1:
        return [[uuid.uuid4().hex for _ in range(n)] for _ in range(count)]
    if rid is None:
        return [[uuid.uuid4().hex] for _ in range(count)]
    if single:
        if not isinstance(rid, str):
            raise RequestError("The rid should be a string for a single prompt.")
        return [[rid]]
    if isinstance(rid, str):
        rids = [f"{rid}_{i}" for i in range(count)]
    else:
        if len(rid) != count:
            raise RequestError(
                "The specified rids length mismatch with the batch_size for batch processing."
            )
        rids = list(rid)
    duplicates = sorted({r for r in rids if rids.count(r) > 1})
    if duplicates:
        raise RequestError(f"Duplicate request IDs detected within the request: {duplicates}")
    return [[r] for r in rids]


# -- responses ----------------------------------------------------------------------------


def finish_reason_json(completion: Completion) -> dict[str, Any] | None:
    """Our finish reason -> SGLang's `meta_info.finish_reason` (None while streaming)."""
    if completion.finish_reason is None:
        return None
    if completion.finish_reason == "stop":
        matched = completion.matched_stop
        if matched is None and completion.output_ids:
            matched = completion.output_ids[-1]
        return {"type": "stop", "matched": matched}
    if completion.finish_reason == "length":
        return {"type": "length", "length": completion.completion_tokens}
    return {"type": "abort", "message": "aborted", "status_code": None, "err_type": None}


def output_text(
    completion: Completion,
    decode: Callable[..., str],
    *,
    skip_special_tokens: bool,
    no_stop_trim: bool,
) -> str:
    """The response text: SGLang trims a matched stop token or string unless no_stop_trim."""
    ids = completion.output_ids
    matched = completion.matched_stop
    if completion.finish_reason == "stop" and matched is None and ids:
        matched = ids[-1]
    if isinstance(matched, int) and not no_stop_trim and ids and ids[-1] == matched:
        ids = ids[:-1]
    text = decode(ids, skip_special_tokens=skip_special_tokens)
    if isinstance(matched, str) and completion.finish_reason == "stop":
        pos = text.find(matched)
        if pos >= 0:
            text = text[: pos + len(matched)] if no_stop_trim else text[:pos]
    return text


def response_json(
    item: WireItem,
    completion: Completion,
    *,
    text: str | None,
    weight_version: str,
    token_text: Callable[[int], str | None] = lambda _: None,
    prompt_token_ids: bool = False,
) -> dict[str, Any]:
    """A Completion -> one SGLang /generate response object (text None: no "text")."""
    meta: dict[str, Any] = {
        "id": item.rid,
        "finish_reason": finish_reason_json(completion),
        "prompt_tokens": completion.prompt_tokens,
        "weight_version": weight_version,
        "completion_tokens": completion.completion_tokens,
        "cached_tokens": completion.cached_tokens,
        "reasoning_tokens": 0,
        "num_retractions": 0,
        "e2e_latency": completion.latency_s,
    }
    if item.return_logprob:
        request = item.request
        entry = lambda lp, t: [lp, t, token_text(t)]  # noqa: E731
        start = request.logprob_start_len
        prompt = request.input_ids
        scores = completion.prompt_logprobs or []
        meta["input_token_logprobs"] = [
            entry(lp, t) for lp, t in zip(scores, prompt[start:] if start >= 0 else [])
        ]
        meta["output_token_logprobs"] = [
            entry(lp, t) for lp, t in zip(completion.logprobs, completion.output_ids)
        ]
        meta["output_token_logprobs_length"] = len(completion.output_ids)
        if request.top_logprobs_num:
            meta["input_top_logprobs"] = [
                None if row is None else [entry(lp, t) for t, lp in row]
                for row in completion.prompt_top_logprobs or []
            ]
            meta["output_top_logprobs"] = [
                [entry(lp, t) for t, lp in row] for row in completion.top_logprobs or []
            ]
    out: dict[str, Any] = {}
    if text is not None:
        out["text"] = text
    out["output_ids"] = list(completion.output_ids)
    out["meta_info"] = meta
    if prompt_token_ids:
        out["prompt_token_ids"] = list(item.request.input_ids)
    return out


# -- client side --------------------------------------------------------------------------


def sampling_to_json(params: SamplingParams) -> dict[str, Any]:
    """SamplingParams -> SGLang `sampling_params`, every field explicit."""
    out = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty,
        "frequency_penalty": params.frequency_penalty,
        "presence_penalty": params.presence_penalty,
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": True,  # only the request's stop ids end it
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if params.stop:
        out["stop"] = list(params.stop)
    if params.seed is not None:  # SGLang's seeds are signed 64-bit
        out["sampling_seed"] = params.seed - SEED_SPACE if params.seed >= INT64 else params.seed
    return out


def generate_payload(
    requests: Sequence[GenerateRequest], rids: Sequence[str], *, lora_path: str | None = None
) -> dict[str, Any]:
    """One batched /generate body for `requests` with request ids `rids` (unique), served
    by the LoRA adapter named `lora_path` when given."""
    payload: dict[str, Any] = {
        "input_ids": [list(r.input_ids) for r in requests],
        "sampling_params": [sampling_to_json(r.sampling) for r in requests],
        "return_logprob": True,
        "rid": list(rids),
    }
    if any(r.top_logprobs_num for r in requests):
        payload["top_logprobs_num"] = [r.top_logprobs_num for r in requests]
    if any(r.logprob_start_len >= 0 for r in requests):
        payload["logprob_start_len"] = [r.logprob_start_len for r in requests]
    if lora_path is not None:
        payload["lora_path"] = lora_path
    return payload


def _version(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class MalformedResponse(ValueError):
    """A server's reply that does not follow the wire format (a server fault, not the caller's)."""


def _logprob(value: Any, where: str) -> float:
    """A log-probability from the wire: a number, -inf included; null and NaN are refused.

    SGLang reports null where it could not compute a log-probability (it does so
    for the first prompt token only). In an output token a NaN would go on to
    make the learner's importance weights NaN; so it is an error here, at the
    boundary, retried as any server fault.
    """
    if value is None:
        raise MalformedResponse(f"{where} has no log-probability (null)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedResponse(f"{where}: log-probability {value!r} is not a number")
    logprob = float(value)
    if math.isnan(logprob) or logprob == math.inf:
        raise MalformedResponse(f"{where}: log-probability {logprob} is not a probability's")
    return logprob


def _token(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedResponse(f"{where}: token id {value!r} is not a non-negative integer")
    return value


def _pair_rows(rows: Any, where: str) -> list[tuple[int, float]]:
    """`[[logprob, token id, text | null], ...]` as (id, logprob) pairs, or MalformedResponse."""
    if not isinstance(rows, list):
        raise MalformedResponse(f"{where} is {_kind(rows)}, not a list")
    pairs = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) < 2:
            raise MalformedResponse(f"{where}[{i}] is {str(row)[:60]}, not [logprob, id, ...]")
        pairs.append((_token(row[1], f"{where}[{i}]"), _logprob(row[0], f"{where}[{i}]")))
    return pairs


def _pairs(rows: Any, where: str) -> list[tuple[int, float]] | None:
    return None if rows is None else _pair_rows(rows, where)


def _rows(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise MalformedResponse(f"{where} is {_kind(value)}, not a list")
    return value


def completion_from_json(obj: Any, *, latency_s: float) -> Completion:
    """One SGLang /generate response object -> Completion (tokens from the logprobs).

    Raises MalformedResponse for anything off the wire format: a missing field,
    a token or log-probability of the wrong type, a missing (null) log-probability
    of an output token.
    """
    try:
        meta = obj["meta_info"]
        rows = meta["output_token_logprobs"]
        reason = meta["finish_reason"]
    except (KeyError, TypeError) as e:
        raise MalformedResponse(
            f"malformed /generate response, missing {e}: {str(obj)[:300]}"
        ) from None
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind not in ("stop", "length", "abort"):
        raise MalformedResponse(f"unknown finish_reason {reason!r} in /generate response")
    pairs = _pair_rows(rows, "output_token_logprobs")
    output_ids = [token for token, _ in pairs]
    logprobs = [logprob for _, logprob in pairs]
    top = meta.get("output_top_logprobs")
    prompt_scores = meta.get("input_token_logprobs")
    prompt_top = meta.get("input_top_logprobs")
    try:
        counts = {k: int(meta.get(k, 0)) for k in ("prompt_tokens", "cached_tokens")}
    except (TypeError, ValueError) as e:
        raise MalformedResponse(f"malformed /generate response meta_info: {e}") from None
    return Completion(
        output_ids=output_ids,
        logprobs=logprobs,
        finish_reason=kind,
        prompt_tokens=counts["prompt_tokens"],
        completion_tokens=len(output_ids),
        latency_s=latency_s,
        cached_tokens=counts["cached_tokens"],
        weight_version=_version(meta.get("weight_version")),
        matched_stop=reason.get("matched") if isinstance(reason, dict) else None,
        top_logprobs=[
            _pairs(row, f"output_top_logprobs[{i}]") or []
            for i, row in enumerate(_rows(top, "output_top_logprobs"))
        ]
        if top
        else None,
        prompt_logprobs=[_prompt_logprob(row, i) for i, row in enumerate(prompt_scores)]
        if prompt_scores
        else None,
        prompt_top_logprobs=[
            _pairs(row, f"input_top_logprobs[{i}]")
            for i, row in enumerate(_rows(prompt_top, "input_top_logprobs"))
        ]
        if prompt_top
        else None,
    )


def _prompt_logprob(row: Any, i: int) -> float | None:
    """A prompt token's log-probability; null where SGLang has none (the first token)."""
    where = f"input_token_logprobs[{i}]"
    if not isinstance(row, list) or not row:
        raise MalformedResponse(f"{where} is {str(row)[:60]}, not [logprob, id, ...]")
    return None if row[0] is None else _logprob(row[0], where)
