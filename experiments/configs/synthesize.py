r"""The ToolScale synthesis pipeline (orchestra_jax/synthesis/, arXiv 2511.21689 §3).

  python -m experiments.synthesize --config=experiments/configs/synthesize.py:<variant>

Variants:

  toolscale_tasks  fresh tasks and evolved variants for one of ToolScale's ten
                   domains (domain.folder=bank, in ../shared/toolscale/domains),
                   written by the paper's generator, gpt-5 (models_paper.yaml).
  new_domain       a whole new domain from a name and a description: schema, data
                   model, entries, tools, policy, then its tasks; gpt-5.
  live_tiny        new_domain's stages against the project's server hosting a random
                   tiny model (models_local.yaml, 127.0.0.1:30100): exercises the
                   transport; its outputs are rejected, each with its reason.
  demo             the scripted generator's recorded outputs for ToolScale's school
                   domain (experiments/data/toolscale_demo/): the tasks that
                   grpo_hle.py:toolscale_demo trains on, made offline in seconds.

Outputs go to `out_dir` (see orchestra_jax/synthesis/pipeline.py); a run started
again over the same folder pays only for the calls it has not made.
"""

import os

import ml_collections

CONFIGS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(os.path.dirname(CONFIGS_DIR))
VARIANTS = ("toolscale_tasks", "new_domain", "live_tiny", "demo")
# ToolScale's ten domains, beside the clone (../shared/toolscale/domains).
TOOLSCALE_DOMAINS_DIR = os.path.join(os.path.dirname(REPO_DIR), "shared", "toolscale", "domains")
DEMO_SCRIPT = os.path.join(REPO_DIR, "experiments", "data", "toolscale_demo", "script.json")


def _base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.variant = ""
    c.out_dir = ""  # Empty: runs/synthesize_<variant>.
    c.tau2_data_dir = ""  # tau2's data folder for the probes ("": $TAU2_DATA_DIR).

    # The generating model (synthesis/generator.py GENERATORS): "catalogue", a model of
    # a catalogue file on its OpenAI-compatible endpoint; "scripted", recorded replies.
    c.generator = ml_collections.ConfigDict()
    c.generator.kind = "catalogue"
    c.generator.catalogue = os.path.join(CONFIGS_DIR, "models_paper.yaml")
    c.generator.model = "gpt-5"  # The catalogue entry's name.
    c.generator.max_concurrency = 8  # Requests in flight at once.
    c.generator.retries = 3  # Extra attempts after 5xx/429/timeouts, with backoff.
    c.generator.timeout_s = 600.0  # Per attempt.
    c.generator.script = ""  # scripted: the JSON file of replies by call key.
    c.generator.price_in = 1.25  # scripted: USD per million prompt words (gpt-5's rate).
    c.generator.price_out = 10.0  # scripted: USD per million reply words.
    c.max_concurrency = 8  # Calls of one stage in flight at once.
    c.max_tokens = 16384  # Per reply.
    c.temperature = 1.0  # Samples of one prompt differ (the release samples at 1.0).
    c.attempts = 3  # Samples tried by stages that keep one output (schema, tools, ...).
    c.min_policy_chars = 500  # A shorter policy is rejected.

    # The domain: an existing folder (a path, or a name in domains_dir), or, with
    # folder empty, a new one built from name and description.
    c.domain = ml_collections.ConfigDict()
    c.domain.folder = ""
    c.domain.domains_dir = TOOLSCALE_DOMAINS_DIR
    c.domain.name = ""  # New domains: a Python identifier, the folder's name.
    c.domain.description = ""  # New domains: one paragraph on what it serves.
    # New domains: one entries call per focus (the release varies a subject per call).
    c.domain.entry_focuses = ""
    c.domain.entries_per_table = 3  # Records per table per call.

    c.tasks = ml_collections.ConfigDict()
    c.tasks.num_purposes = 20  # Reasons for a customer's call, one task prompt each.
    c.tasks.samples_per_purpose = 2  # Tasks asked per purpose.
    c.tasks.evolve = True  # One harder variant asked per kept task.

    # The probe process that runs generated code (synthesis/probe.py), in the sandbox.
    c.probe = ml_collections.ConfigDict()
    c.probe.timeout_s = 20.0  # Wall seconds per probe request (plus tau2's start-up).
    c.probe.memory_mb = 4096  # Address space of each probe process.
    # "auto"/"bwrap": bubblewrap (envs/domain_sandbox.py; the WebAssembly CPython cannot
    # import tau2). "rlimits" (no isolation) only with code_is_trusted.
    c.probe.sandbox = "auto"
    c.probe.code_is_trusted = False
    return c


def get_config(variant: str = "demo") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {VARIANTS}")
    c = _base()
    c.variant = variant
    if variant == "toolscale_tasks":
        c.domain.folder = "bank"
    elif variant in ("new_domain", "live_tiny"):
        c.domain.name = "library"
        c.domain.description = (
            "a city's public library network: members borrow, renew, reserve and return "
            "books and pay late fees at its branches"
        )
        c.domain.entry_focuses = "a large central branch,a small suburban branch,a mobile library"
        if variant == "live_tiny":
            c.generator.catalogue = os.path.join(CONFIGS_DIR, "models_local.yaml")
            c.generator.model = "tiny-large"
            c.generator.timeout_s = 120.0
            c.max_tokens = 256  # A random model writes noise: keep it short.
            c.attempts = 2
    elif variant == "demo":
        c.generator.kind = "scripted"
        c.generator.script = DEMO_SCRIPT
        c.domain.folder = "school"
        c.tasks.num_purposes = 3
        c.tasks.samples_per_purpose = 2
    return c
