"""Build the bundled demo tokenizer: `orchestra_jax/chat/assets/demo_tokenizer.json`.

    python scripts/build_demo_tokenizer.py [--out PATH] [--vocab-size 4096] [--seed 0]

A byte-level BPE shaped like Qwen3's (same pre-tokenizer regex, byte-level
decoder, and all 26 Qwen3 special/tool tokens appended after the BPE vocabulary
in Qwen3's order), small enough for the CPU demo model (vocab 4096). It has no
NFC normaliser, unlike Qwen3, so that every string round-trips.

It trains only on text this project generates: seeded synthetic orchestration
conversations rendered with `orchestra_jax.chat.template.render` (using the
paper's three meta-tool schemas below plus a python tool), prompts of the
offline environment (`envs/synthetic.py`) as the demo renders them, English
sentences from a small word list, numbers, prices, JSON and Python snippets.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from orchestra_jax.chat import template
from orchestra_jax.chat.tokenizer import DEMO_TOKENIZER

# Qwen3's added tokens, in id order (151643...151668 there).
QWEN3_ADDED_TOKENS = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
# Qwen3's pre-tokenizer split (contractions, letters, single digits, punctuation runs, spaces).
QWEN3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

PRICE_HEADER = (
    "Model | price per million input tokens | price per million output tokens | average latency"
)


def _meta_tool(name: str, description: str, model_description: str) -> dict:
    parameters = {
        "properties": {"model": {"description": model_description, "type": "string"}},
        "required": ["model"],
        "title": "parameters",
        "type": "object",
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


# The ToolOrchestra release's meta-tools, verbatim (Apache-2.0), as format data.
META_TOOLS = [
    _meta_tool(
        "enhance_reasoning",
        "tool to enhance answer model reasoning. analyze the problem, write code, execute it and "
        "return intermidiate results that will help solve the problem",
        "The model used to reason. Choices: ['reasoner-1', 'reasoner-2', 'reasoner-3']. reasoner-1 "
        "demonstrates strong understanding and reasoning capabilities, which usually provides reliable "
        "insights. reasoner-2 can analyze some problems, but could hallucinate and make mistakes in "
        "difficult scenarios. reasoner-3 can reason over the context and reveal the logic. \n"
        f"{PRICE_HEADER}\nreasoner-1 | $1.25 | $10 | 31s\nreasoner-2 | $0.25 | $2 | 25s\n"
        "reasoner-3 | $0.8 | $0.8 | 9s",
    ),
    _meta_tool(
        "answer",
        "give the final answer. Not allowed to call if documents is empty.",
        "The model used to answer. Choices: ['answer-1', 'answer-2', 'answer-3', 'answer-4', "
        "'answer-math-1', 'answer-math-2']. answer-1 exhibits strong functional calling abilities and "
        "performs excellent in most domains (math, physics, social science, etc.). answer-2 presents "
        "reasonable solutions in some tasks, but could get stuck in complex reasoning and specific domain "
        "knowledge. answer-3 could solve easy to medium tasks, but is not capable of tackling tasks with "
        "strong expertise and long-horizon planning. answer-4 demonstrates basic capability: it can "
        "understand basic instructions, do simple steps, yet it sometimes misreads details, mixes "
        "concepts. answer-math-1 can solve moderate (middle school) math problem, though it becomes "
        "incapable in more difficult tasks. answer-math-2 can follow simple instructions and perform easy "
        "(primary-level) math problems, but struggle in more complex logic. The table below shows the "
        f"pricing and latency of each model:\n{PRICE_HEADER}\nanswer-1 | $1.25 | $10 | 96s\n"
        "answer-2 | $0.25 | $2 | 27s\nanswer-3 | $0.9 | $0.9 | 15s\nanswer-4 | $0.8 | $0.8 | 11s\n"
        "answer-math-1 | $0.9 | $0.9 | 13s\nanswer-math-2 | $$0.2 | $0.2 | 9s",
    ),
    _meta_tool(
        "search",
        "Search for missing information",
        "The model used to search for missing information. Choices: ['search-1', 'search-2', "
        "'search-3']. search-1 usually identifies the missing information and can write concise queries "
        "for effective search. search-2 can reason over the context and write queries to find the "
        "missing content for answering questions. search-3 can also write queries to find information. "
        f"The table below shows the pricing and latency:\n{PRICE_HEADER}\nsearch-1 | $1.25 | $10 | 22s\n"
        "search-2 | $0.25 | $2 | 16s\nsearch-3 | $0.8 | $0.8 | 8s",
    ),
]
PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code in a sandbox and return its standard output.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code."}},
            "required": ["code"],
        },
    },
}

WORDS = """
the of and to in is was for that on as with by at from his her it an were are which this be or has
had not but first one their its new after who they have two been she he other all also into more
time year years during city world state people between when about over most many some what how why
where there these than only then while through under before such known would could should can may
answer question search model tool price cost latency user reasoning call result document query
number total value step check compute sum product difference list name country river capital
population born died war king queen team game season album song film book author university school
mountain island north south east west largest smallest oldest last next previous
because therefore however since until each every both either neither much few several whether
think let me need use know see look make take give get find tell ask work seem feel try leave
science physics chemistry biology history math equation function variable integer prime square root
percent average median minimum maximum probability distribution sample random seed train test
""".split()
NAMES = "Alice Bob Paris London Berlin Tokyo Einstein Newton Curie Darwin Nile Amazon Everest Python".split()
# Syllables for pseudo-words, so the merges also cover word pieces beyond the short word list.
ONSETS = "b c d f g h j k l m n p r s t v w z br ch cl cr dr fl gr pl pr sh st str th tr".split()
NUCLEI = "a e i o u ai ea ee io ou ia".split()
CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck", "rt", "x"]
ALIASES = [
    "search-1",
    "search-2",
    "search-3",
    "reasoner-1",
    "reasoner-2",
    "reasoner-3",
    "answer-1",
    "answer-2",
    "answer-3",
    "answer-4",
    "answer-math-1",
    "answer-math-2",
]


def sentence(rng: random.Random) -> str:
    words = [word(rng) for _ in range(rng.randint(4, 18))]
    if rng.random() < 0.3:
        words.insert(
            rng.randrange(len(words)),
            str(rng.choice([rng.randint(0, 100), rng.randint(1000, 2025)])),
        )
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", "?", "!", ":", ","])


def pseudo_word(rng: random.Random) -> str:
    word = "".join(
        rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(CODAS)
        for _ in range(rng.randint(1, 3))
    )
    return word.capitalize() if rng.random() < 0.2 else word


def word(rng: random.Random) -> str:
    roll = rng.random()
    return (
        rng.choice(WORDS) if roll < 0.75 else rng.choice(NAMES) if roll < 0.85 else pseudo_word(rng)
    )


def number_text(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(1, 999)
    op, value = rng.choice([("+", a + b), ("-", a - b), ("*", a * b), ("/", round(a / b, 4))])
    return rng.choice(
        [
            f"{a} {op} {b} = {value}",
            f"${rng.randint(0, 99)}.{rng.randint(0, 99):02d}",
            f"{rng.uniform(0, 100):.3f}",
            f"{rng.randint(1, 120)}s",
            f"{a}%",
            f"x^{b % 9} + {a}",
        ]
    )


def python_snippet(rng: random.Random) -> str:
    n = rng.randint(2, 500)
    return rng.choice(
        [
            f"print(sum(range({n})))",
            f"import math\nprint(math.sqrt({n}))",
            f"def f(x):\n    return x * {n}\n\nprint(f({n % 17}))",
            f"values = [{', '.join(str(rng.randint(0, 99)) for _ in range(5))}]\nprint(sorted(values))",
            f"for i in range({n % 10}):\n    if i % 2 == 0:\n        print(i)",
        ]
    )


def conversation(rng: random.Random) -> str:
    """One rendered orchestration episode: tools, preference, question, calls, results, answer."""
    tools = META_TOOLS + ([PYTHON_TOOL] if rng.random() < 0.5 else [])
    system = f"You are good at using tools. {sentence(rng)} Preference: " + ", ".join(
        f"{a}: {rng.randint(0, 3)}" for a in rng.sample(ALIASES, 3)
    )
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Problem: " + " ".join(sentence(rng) for _ in range(2))},
    ]
    for _ in range(rng.randint(1, 4)):
        name = rng.choice(["search", "enhance_reasoning", "answer", "python"])
        args = {"code": python_snippet(rng)} if name == "python" else {"model": rng.choice(ALIASES)}
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": sentence(rng),
                "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}],
            }
        )
        messages.append(
            {
                "role": "tool",
                "content": " ".join(
                    rng.choice([sentence, number_text])(rng) for _ in range(rng.randint(1, 6))
                ),
            }
        )
    messages.append({"role": "assistant", "content": f"The answer is {number_text(rng)}"})
    return template.render(messages, tools=tools)


_ENV = {}


def env_episode(rng: random.Random) -> str:
    """A prompt of the offline environment as the demo renders it (both description
    styles, sampled prices and preferences), a routed call and a tool result: the
    demo's prompts then cost few tokens, which is most of a CPU step's cost."""
    from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
    from orchestra_jax.tools.config_sampler import SamplerRanges

    if not _ENV:
        _ENV["env"] = env = SyntheticOrchestrationEnv(seed=1234)
        _ENV["corpus"] = [d.text for d in env.corpus()]
        _ENV["samplers"] = [
            env.tool_config_sampler(
                seed=5, description_style=style, ranges=SamplerRanges(shuffle_aliases=shuffle)
            )
            for style in ("full", "compact")
            for shuffle in (True, False)
        ]
    env = _ENV["env"]
    task = env.task(rng.choice(["train", "heldout"]), rng.randrange(20000))
    config = rng.choice(_ENV["samplers"]).sample(task, rng.randrange(2**31))
    messages = [
        {"role": "system", "content": config.system_prompt()},
        {"role": "user", "content": task.question},
    ]
    for _ in range(rng.randint(0, 2)):
        alias = rng.choice(config.aliases)
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": alias.tool, "arguments": {"model": alias.alias}},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "content": rng.choice(_ENV["corpus"])})
    return template.render(
        messages,
        tools=config.tool_schemas(),
        add_generation_prompt=True,
        enable_thinking=rng.random() < 0.5,
    )


def corpus(seed: int, n_docs: int) -> list[str]:
    rng = random.Random(seed)
    makers = [
        conversation,
        sentence,
        number_text,
        python_snippet,
        lambda r: json.dumps(
            {"name": r.choice(WORDS), "arguments": {r.choice(WORDS): number_text(r)}}
        ),
        env_episode,
        env_episode,
    ]
    return [makers[i % len(makers)](rng) for i in range(n_docs)]


def build(*, vocab_size: int = 4096, seed: int = 0, n_docs: int = 20000) -> tokenizers.Tokenizer:
    """Train the BPE on `corpus(seed)`; ids [0, vocab_size - 26) are BPE, the rest Qwen3's added tokens."""
    tok = tokenizers.Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(QWEN3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(QWEN3_ADDED_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed, n_docs), trainer=trainer)
    tok.add_special_tokens(
        [
            tokenizers.AddedToken(t, special=special, normalized=False)
            for t, special in QWEN3_ADDED_TOKENS
        ]
    )
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=pathlib.Path, default=DEMO_TOKENIZER)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tok = build(vocab_size=args.vocab_size, seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out), pretty=False)
    print(f"wrote {args.out}: {tok.get_vocab_size()} ids, {args.out.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
