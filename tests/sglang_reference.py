"""SGLang 0.5.23's own request validation, imported offline without its GPU stack.

Loads, from the installed `sglang` wheel (`pip install --no-deps sglang==0.5.23`),
only the modules that judge a /generate request: the JSON contract
(`sglang.api.v1.api_types`), `GenerateReqInput` (`sglang.srt.managers.io_struct`)
and `SamplingParams` (`sglang.srt.sampling.sampling_params`). The `sglang`
package's `__init__` (which pulls the serving stack) is not run, and the modules
io_struct imports for GPU-side types are stubbed (empty stand-ins: the validation
code never calls them). `verdict(body, ...)` runs them in the order SGLang's HTTP
server does and returns None (accepted) or the error message.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import importlib
import importlib.util
import sys
import types

import msgspec

VERSION = "0.5.23"

# Modules io_struct imports for types of the serving stack (GPU memory, multimodal
# data, LoRA, IPC); the validation code paths do not use them.
_STUBBED = (
    "zmq",
    "zmq.asyncio",
    "sglang.srt.beam_search.types",
    "sglang.srt.lora.lora_registry",
    "sglang.srt.managers.embed_types",
    "sglang.srt.managers.kv_hints",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.multimodal.mm_utils",
    "sglang.srt.sampling.sampling_mask",
    "sglang.srt.utils",
    "sglang.srt.utils.msgpack_utils",
    "sglang.srt.utils.msgspec_utils",
    "sglang.srt.utils.weight_versions",
)


# Definitions the validation path calls in stubbed modules: taken from SGLang's own
# source files (module -> [(file under sglang/srt, name)]), not rewritten.
_FROM_SOURCE = {
    "sglang.srt.managers.schedule_batch": [
        ("model_executor/forward_batch_info.py", "CaptureHiddenMode"),
        ("managers/schedule_batch.py", "get_return_hidden_states_mode"),
    ],
    "sglang.srt.multimodal.mm_utils": [
        ("utils/common.py", "flatten_nested_list"),
        ("multimodal/mm_utils.py", "has_valid_data"),
    ],
}


def _define_from_source(module: types.ModuleType, srt: str, file: str, name: str) -> None:
    """Execute SGLang's top-level definition `name` from `file` inside `module`."""
    with open(f"{srt}/{file}", encoding="utf-8") as f:
        tree = ast.parse(f.read())
    [node] = [n for n in tree.body if getattr(n, "name", None) == name]
    namespace = module.__dict__
    namespace.setdefault("IntEnum", enum.IntEnum)
    namespace.setdefault("total_ordering", functools.total_ordering)
    exec(compile(ast.Module([node], type_ignores=[]), file, "exec"), namespace)  # noqa: S102


class _Stub(types.ModuleType):
    """A module whose every attribute is a fresh placeholder (a tagged msgspec Struct,
    so io_struct's IPC codec, built at import, accepts it in its unions)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = types.new_class(name, (msgspec.Struct,), {"tag": f"stub.{name}"})
        setattr(self, name, value)
        return value


def _package(name: str, path: list[str]) -> None:
    module = types.ModuleType(name)
    module.__path__ = path
    sys.modules[name] = module


def load():
    """(api_types, io_struct, sampling_params) modules of the installed sglang wheel."""
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        raise ImportError("sglang is not installed (pip install --no-deps sglang==0.5.23)")
    root = spec.submodule_search_locations[0]
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    saved.update({k: sys.modules[k] for k in ("zmq", "zmq.asyncio") if k in sys.modules})
    try:
        # Packages as bare namespaces, so no __init__ runs (sglang's imports the server).
        for package in ("sglang", "sglang.srt", "sglang.srt.utils"):
            _package(package, [root + package[len("sglang") :].replace(".", "/")])
        for name in _STUBBED:
            if name != "sglang.srt.utils":
                sys.modules[name] = _Stub(name)
            for file, definition in _FROM_SOURCE.get(name, ()):
                _define_from_source(sys.modules[name], root + "/srt", file, definition)
        sys.modules["sglang.srt.utils"] = utils = _Stub("sglang.srt.utils")
        utils.__path__ = [root + "/srt/utils"]
        field_validators = importlib.import_module("sglang.srt.utils.field_validators")
        utils.field_validators = field_validators
        version = importlib.import_module("sglang.version").__version__
        if version != VERSION:
            raise ImportError(f"sglang {version} is installed; the reference is {VERSION}")
        api_types = importlib.import_module("sglang.api.v1.api_types")
        sampling_params = importlib.import_module("sglang.srt.sampling.sampling_params")
        io_struct = importlib.import_module("sglang.srt.managers.io_struct")
        return api_types, io_struct, sampling_params
    finally:
        for key in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[key]
        for key in ("zmq", "zmq.asyncio"):
            sys.modules.pop(key, None)
        sys.modules.update(saved)


class Tokenizer:
    """What SamplingParams.normalize asks of a tokenizer, over ours."""

    def __init__(self, tokenizer):
        self._tok = tokenizer

    def encode(self, text, add_special_tokens=False):
        return self._tok.encode(text)


def verdict(modules, body, *, vocab_size: int, context_len: int, tokenizer=None) -> str | None:
    """None if SGLang 0.5.23 accepts the /generate `body`, else its error message.

    The order of SGLang's HTTP server: FastAPI builds a GenerateReqInput from the
    body's known fields; the JSON contract gate; `normalize_batch_and_arguments`;
    per prompt, the tokenizer manager's context check (reproduced here from
    `TokenizerManager._validate_one_request`, whose module needs the serving
    stack), `SamplingParams(**params).normalize(tokenizer)` and `.verify(vocab)`;
    then the scheduler's `logprob_start_len` check (an abort with status 400).
    """
    api_types, io_struct, sampling_params = modules
    try:
        fields = {f.name for f in dataclasses.fields(io_struct.GenerateReqInput)}
        if not isinstance(body, dict):
            raise ValueError("body must be an object")
        api_types.GenerateRequest.from_json_value(body)
        obj = io_struct.GenerateReqInput(**{k: v for k, v in body.items() if k in fields})
        obj.normalize_batch_and_arguments()
        items = [obj] if obj.is_single else [obj[i] for i in range(obj.batch_size)]
        for item in items:
            ids = item.input_ids
            if ids is None:
                if tokenizer is None:
                    raise ValueError("text prompts need a tokenizer")
                ids = tokenizer.encode(item.text)
            if len(ids) >= context_len:
                raise ValueError(f"The input ({len(ids)} tokens) is longer than the context")
            max_new = item.sampling_params.get("max_new_tokens")
            if max_new is not None and max_new + len(ids) > context_len:
                raise ValueError("Requested token count exceeds the model's context length")
            params = sampling_params.SamplingParams(**item.sampling_params)
            params.normalize(tokenizer)
            params.verify(vocab_size)
            if item.return_logprob and item.logprob_start_len > len(ids):
                raise ValueError("logprob_start_len is higher than the number of input tokens")
    except (ValueError, TypeError) as e:
        return str(e) or type(e).__name__
    return None
