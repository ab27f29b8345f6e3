"""chat_format: our Qwen3 chat rendering and tokenization against Hugging Face's, same inputs.

    python -m experiments.benchmarks.chat_format --qwen3 /path/to/Qwen3-0.6B [--quick]

`--qwen3`: a Hugging Face Qwen3 folder with tokenizer.json and its chat template.

Workload: seeded orchestration episodes like the agent loop's (system prompt,
the three meta-tool schemas, a question, T turns of reasoning + one tool call +
tool results, a final answer), T in {2, 8, 16}. Measured per episode, timed
alternately (ours, peer, ours, ...), medians over repeats:
  render   `template.render` vs `AutoTokenizer.apply_chat_template(tokenize=False)`
  encode   `ChatTokenizer.encode` vs `AutoTokenizer(text, add_special_tokens=False)`
  parse    `parse_tool_calls` over every assistant turn (no peer; absolute figure)
Both sides produce identical text and ids (checked before timing).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random

from experiments.benchmarks.common import alternate_timings, summarize, write_result
from orchestra_jax.chat import template
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.chat.tool_calls import parse_tool_calls

ALIASES = [
    "search-1",
    "search-2",
    "search-3",
    "reasoner-1",
    "reasoner-2",
    "answer-1",
    "answer-math-2",
]


def meta_tools() -> list[dict]:
    def tool(name: str) -> dict:
        model = {
            "type": "string",
            "description": f"The model to use. Choices: {ALIASES}. " + "Price table. " * 20,
        }
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": f"The {name} tool.",
                "parameters": {
                    "type": "object",
                    "properties": {"model": model},
                    "required": ["model"],
                },
            },
        }

    return [tool("search"), tool("enhance_reasoning"), tool("answer")]


def episode(rng: random.Random, turns: int) -> list[dict]:
    messages = [
        {"role": "system", "content": "You are good at using tools. Preference: cheap, fast."},
        {"role": "user", "content": "Problem: " + "What is the capital of France? " * 5},
    ]
    for t in range(turns):
        call = {
            "type": "function",
            "function": {"name": "search", "arguments": {"model": rng.choice(ALIASES)}},
        }
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": f"Step {t}: I need more facts. " * 8,
                "tool_calls": [call],
            }
        )
        messages.append(
            {"role": "tool", "content": "Document: Paris is the capital of France. " * 30}
        )
    messages.append({"role": "assistant", "content": "The answer is Paris."})
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--qwen3", type=pathlib.Path, required=True, help="a Qwen3 tokenizer folder"
    )
    args = parser.parse_args()
    from transformers import AutoTokenizer  # the peer; imported here so --help stays fast

    hf, ours = AutoTokenizer.from_pretrained(str(args.qwen3)), load_tokenizer(args.qwen3)
    tools, repeats, figures = meta_tools(), 5 if args.quick else 30, {}
    for turns in (2, 8, 16):
        messages = episode(random.Random(turns), turns)
        text = template.render(messages, tools=tools)
        assert text == hf.apply_chat_template(messages, tools=tools, tokenize=False)
        assert ours.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
        generated = [
            template.render([messages[1], m]).split("<|im_start|>assistant\n")[-1]
            for m in messages
            if m["role"] == "assistant"
        ]
        timings = alternate_timings(
            {  # each lambda binds this episode's messages, text and generated turns
                "render_ours": lambda m=messages: template.render(m, tools=tools),
                "render_hf": lambda m=messages: hf.apply_chat_template(
                    m, tools=tools, tokenize=False
                ),
                "encode_ours": lambda t=text: ours.encode(t),
                "encode_hf": lambda t=text: hf(t, add_special_tokens=False),
                "parse_ours": lambda g=generated: [parse_tool_calls(x, tools) for x in g],
            },
            repeats=repeats,
        )
        stats = summarize(timings)
        figures[f"turns_{turns}"] = {
            "chars": len(text),
            "tokens": len(ours.encode(text)),
            "timings": stats,
            "render_speedup": stats["render_hf"]["median_s"] / stats["render_ours"]["median_s"],
            "encode_speedup": stats["encode_hf"]["median_s"] / stats["encode_ours"]["median_s"],
        }
    path = write_result("chat_format", {"repeats": repeats, "figures": figures})
    print(json.dumps(figures, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
