"""The Qwen3 chat format: rendering, tool-call parsing and tokenizers.

- `template`: `render` (byte-identical to Hugging Face's Qwen3 template) and the
  incremental segments an agent loop appends after a generated `<|im_end|>`.
- `tool_calls`: `parse_tool_calls` -> `ToolCall | ToolCallError`, never raises on model text.
- `tokenizer`: `load_tokenizer("demo" | folder) -> ChatTokenizer`.
"""

from orchestra_jax.chat.template import render, tool_response_segment, user_message_segment
from orchestra_jax.chat.tokenizer import ChatTokenizer, load_tokenizer
from orchestra_jax.chat.tool_calls import (
    ToolCall,
    ToolCallError,
    parse_tool_calls,
    split_reasoning,
    strip_think,
)

__all__ = [
    "ChatTokenizer",
    "ToolCall",
    "ToolCallError",
    "load_tokenizer",
    "parse_tool_calls",
    "render",
    "split_reasoning",
    "strip_think",
    "tool_response_segment",
    "user_message_segment",
]
