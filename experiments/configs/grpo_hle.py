r"""GRPO training of a tool orchestrator (ToolOrchestra, arXiv 2511.21689).

Variants (`--config=experiments/configs/grpo_hle.py:<variant>`):

  demo        tiny random Qwen3 + bundled tokenizer + the offline synthetic
              environment; warm start, GRPO and held-out evaluation on a
              2-core CPU in minutes. The README's main command.
  micro       the smallest config the end-to-end test runs (two GRPO steps).
  live_tiny   the whole live path on a 2-core CPU: a tiny policy; the project's
              server hosting a tiny model on 127.0.0.1:30100 as every expert and
              as the judge (models_local.yaml); a BM25 index of a small corpus;
              FRAMES rows from ../shared/reference/frames.jsonl (docs/live_setup.md).
  tau2_demo   τ²-bench's `mock` domain on a 2-core CPU: a tiny random policy in
              conversations with a scripted user (or tau2's user simulator on
              the project's server), graded by tau2; needs the tau2 extra and
              ../shared/tau2-bench beside the clone.
  toolscale_demo  ToolScale's school domain on a 2-core CPU: tasks the synthesis
              pipeline made from recorded generator replies
              (experiments/data/toolscale_demo/, synthesize.py:demo), a tiny
              random policy, a scripted user, graded by tau2, pass^k on the
              held-out tasks; needs the tau2 extra, ../shared/tau2-bench and
              ../shared/toolscale beside the clone.
  qwen3_0p6b  Qwen3-0.6B from a Hugging Face folder, notebooks and single hosts,
              live experts, search and judge as qwen3_8b.
  qwen3_8b    Qwen3-8B trained with the reference release's recipe, every
              setting as its training scripts set it: rebuilt prompts, turn
              samples, mini-batches of 16, its reward, advantage boost and
              no-answer filter, its experts, the paper's evaluation (G=8, 16
              tasks per step, lr 1e-6, clip 0.2/0.28, dual clip 10, KL 1e-4 as
              ½Δ², 30 turns, 24k-token prompts, 8768-token responses); TPU pods /
              GPU clusters, the paper's experts (models_paper.yaml), a search
              index, the judge; ready for a ToolScale mixture (see there).
  qwen3_8b_lora  qwen3_8b's recipe on one host: LoRA adapters (rank 64) train,
              the base is frozen in bfloat16, the JAX engine samples with the
              adapters beside the learner (docs/scaling.md, "LoRA on one host").
  lora_demo   the demo training LoRA adapters (rank 8) instead of every weight.
  qwen3_8b_project  Qwen3-8B with the same hyperparameters and the project's own
              choices (docs/reproduction.md, "Each difference at a glance"): one
              growing sequence per episode, the preference reward, the project's
              experts, the held-out evaluation.

Every field is validated at start-up by its section's class (`orchestra_jax.training.experiment_config`).
Override any field on the command line: `--config.rl.lr=3e-6`.
"""

import os

import ml_collections

from orchestra_jax.rl import grpo
from orchestra_jax.tools import pricing
from orchestra_jax.training import warm_start

VARIANTS = (
    "demo",
    "micro",
    "live_tiny",
    "tau2_demo",
    "toolscale_demo",
    "qwen3_0p6b",
    "qwen3_8b",
    "qwen3_8b_project",
    "qwen3_8b_lora",
    "lora_demo",
)
CONFIGS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(os.path.dirname(CONFIGS_DIR))
# The model catalogues (orchestra_jax/tools/experts/catalogue.py) shipped beside this file.
PAPER_CATALOGUE = os.path.join(CONFIGS_DIR, "models_paper.yaml")
# The file readers of data/readers.py: their data.paths / data.eval_paths keys exist in
# every variant, so --config.data.paths.frames=... works on the command line.
FILE_SOURCES = ("frames", "generalthought", "hle", "jsonl", "tau2", "toolscale")
LOCAL_CATALOGUE = os.path.join(CONFIGS_DIR, "models_local.yaml")


def _base() -> ml_collections.ConfigDict:
    # The held-out reward's scales, shared by eval.* and reward.* (reward.type="utility").
    cost_scale_usd = ml_collections.FieldReference(0.02)
    latency_scale_s = ml_collections.FieldReference(120.0)
    c = ml_collections.ConfigDict()
    c.variant = ""
    c.seed = 0
    c.workdir = ""  # Empty: runs/<variant>.
    c.num_steps = 100

    # --- the policy ------------------------------------------------------------
    c.model = ml_collections.ConfigDict()
    c.model.preset = ""  # A Qwen3Config preset name ("demo", "qwen3_8b", ...),
    c.model.hf_path = ""  # or a Hugging Face folder (config.json + safetensors).
    c.model.param_dtype = "float32"
    c.model.dtype = "float32"  # Compute dtype.
    c.model.scan_layers = False
    c.model.remat = "none"
    c.model.attention = "auto"  # models/attention_kernels.py: auto, flash, xla, cudnn, splash.
    c.model.overrides = ml_collections.ConfigDict()  # Qwen3Config fields over the preset.
    c.tokenizer = "demo"  # "demo" (bundled) or a folder with tokenizer.json.
    # LoRA (models/lora.py): rank 0 trains every weight; rank > 0 trains only
    # adapters of that rank on the projections named, the base frozen in
    # model.param_dtype; the KL reference is the base with the warm start's adapters
    # after a warm start (sft.steps > 0), else with the adapters off (the start).
    c.lora = ml_collections.ConfigDict()
    c.lora.rank = 0
    c.lora.alpha = 16.0  # Adapters scaled by alpha / rank (PEFT's lora_alpha).
    c.lora.dropout = 0.0  # Must be 0 to train: adapters run without dropout here.
    c.lora.targets = "q,k,v,o,gate,up,down"  # Projections with adapters (PEFT's *_proj).

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1
    c.mesh.fsdp = -1  # -1: every remaining device.
    c.mesh.tensor = 1

    # Multi-host jobs (orchestra_jax/parallel/distributed.py). Unset fields come
    # from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID.
    c.distributed = ml_collections.ConfigDict()
    c.distributed.coordinator_address = ""  # "host:port" of process 0.
    c.distributed.num_processes = 0  # 0: from the environment or detected.
    c.distributed.process_id = -1  # -1: from the environment or detected.
    # JAX's cluster detection (Cloud TPU pods, Slurm, Open MPI); also turned on
    # by ORCHESTRA_JAX_DISTRIBUTED=1 (launch/tpu_pod.sh).
    c.distributed.auto_detect = False

    # --- rollouts --------------------------------------------------------------
    c.rollout = ml_collections.ConfigDict()
    c.rollout.engine = "jax"  # "jax" (in process), "sglang" or "vllm" (servers).
    c.rollout.urls = ""  # sglang, vllm: comma-separated server (sglang: or router) URLs.
    c.rollout.weights_dir = ""  # sglang, vllm: where HF weights are written per sync.
    # sglang, vllm: the environment variable holding the servers' API key, sent as
    # `Authorization: Bearer` (unset or empty: none; launch/README.md, "Access").
    c.rollout.api_key_env = "ROLLOUT_API_KEY"
    # sglang, vllm: largest |served − learner| log-prob of the sync probe's tokens after
    # a sync (rollout/http/sync_probe.py); 0: the serving dtype's tolerance.
    c.rollout.sync_tolerance = 0.0
    c.rollout.max_batch_size = 64  # jax: concurrent sequences in the decode batch.
    c.rollout.max_seq_len = 2048  # jax: KV-cache length per sequence.
    c.rollout.prefix_cache = True  # jax: reuse finished rows' KV for shared prompt prefixes.
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = -1
    # Extra attempts at a call to a service that has no retries of its own: a
    # search backend's query and τ²'s evaluator (engines, experts, the judge and
    # the user simulator retry in their own clients). An episode whose service
    # still fails is an infrastructure failure: neither trained on nor scored.
    c.rollout.infra_retries = 2
    # sglang, vllm: how the client treats its servers (rollout/http/server_pool_settings.py).
    c.rollout.server_pool = ml_collections.ConfigDict()
    c.rollout.server_pool.timeout_s = 600.0  # The longest one HTTP call may take.
    # A call that meets a server fault is retried this many times (on another server
    # where one is up), after backoff_s * 2**attempt seconds; at start-up the same
    # bound decides when a server that never answers is out.
    c.rollout.server_pool.max_retries = 4
    c.rollout.server_pool.backoff_s = 0.5
    c.rollout.server_pool.max_consecutive_errors = 3  # Failed calls in a row: out.
    c.rollout.server_pool.recheck_s = 10.0  # Seconds between checks of a server that is out,
    c.rollout.server_pool.health_interval_s = 60.0  # and of one that is up (0: none).
    c.rollout.server_pool.health_timeout_s = 30.0  # The longest a /health check may take.
    # Generate calls open at once on each server; 0: the client's own bound (SGLang: every
    # chunk, vLLM: 256 requests).
    c.rollout.server_pool.max_in_flight = 0

    # --- episodes --------------------------------------------------------------
    c.agent = ml_collections.ConfigDict()
    c.agent.max_turns = 30
    c.agent.max_context_tokens = 2048
    c.agent.max_new_tokens_per_turn = 128
    c.agent.tool_timeout_s = 60.0
    c.agent.enable_thinking = False
    # 0: a turn's latency is measured wall time. > 0: generated tokens x this
    # (offline runs: rewards independent of machine load, resume exact).
    c.agent.seconds_per_generated_token = 0.0
    # Episodes in flight at once (0: all of a step's, or of an evaluation). A
    # tool call's wait for a free sandbox or retrieval thread counts against
    # tool_timeout_s, so routers, which answer instantly, need a bound.
    c.agent.max_concurrent_episodes = 0
    # What the orchestrator reads each turn (agent/context.py CONTEXT_POLICIES, or
    # "package.module:attr"): "history", one growing sequence (the system prompt,
    # the question, every earlier turn and its tool results); "rebuild", the
    # reference's: every turn a fresh chat of the question, the documents gathered
    # and the programs run so far, never its own earlier turns; in a τ² conversation
    # the messages so far, whole ones dropped from the middle to fit (needs
    # rl.sample_unit="turn").
    c.agent.context = "history"
    # How a QA turn's calls are read (agent/reference_turns.py): "project" (calls
    # outside <think>, every one run, the turn malformed when any is invalid) or
    # "reference" (the release's: calls in <think> too, the first per tool, well-formed
    # with one valid call).
    c.agent.tool_calls = "project"
    # What an episode is charged: "project" (every call, the slowest tool and the
    # generation time as a turn's latency) or "reference" (the release's: calls summed
    # up to the answer call, which is not charged; no generation time).
    c.agent.accounting = "project"
    # True: a call's enum arguments (its tool's model aliases) are sampled only among
    # the values that tool allows, in training and evaluation (agent/enum_arguments.py;
    # rollout.engine="jax" only). Router demonstrators write valid calls already.
    c.agent.constrain_enum_arguments = False
    # The rebuilt prompt ("rebuild"; the reference's values).
    c.agent.rebuild = ml_collections.ConfigDict()
    c.agent.rebuild.system = "You are good at using tools. "  # The system message.
    c.agent.rebuild.instruction = "Choose an approriate tool."  # Ends the user message (sic).
    c.agent.rebuild.doc_chars = 4000  # Each document's first this many characters.
    c.agent.rebuild.code_tokens = 24000  # Programs and outputs: their last this many tokens.
    c.agent.rebuild.context_tokens = 24000  # Documents + programs: their last this many tokens.
    c.agent.rebuild.prompt_tokens = 24000  # The rendered prompt: its middle cut to this many.
    # A conversation (τ²): whole messages dropped from its middle to fit this many
    # tokens less the tool schemas', before the prompt_tokens cut.
    c.agent.rebuild.conversation_tokens = 23000
    # Programs shown: "formatted" (stdout, stderr, exit status, "(no output)"; every
    # program) or "stdout" (the reference's: what it printed, verbatim, when not blank).
    c.agent.rebuild.programs = "formatted"
    # How texts are cut to their budgets: "project" (kept as they are when under it)
    # or "reference" (the reference's cut_seq: re-decoded id by id, special-token text
    # dropped; a multi-byte character split over ids becomes U+FFFD, its bug).
    c.agent.rebuild.cut = "project"

    # --- tasks -----------------------------------------------------------------
    c.data = ml_collections.ConfigDict()
    # Comma-separated `source[:weight]` list; a source is a task reader of
    # data/readers.py READERS ("synthetic", "frames", "jsonl", ...) or "package.module:reader".
    c.data.sources = "synthetic"
    # File source (a reader, or an import path's attribute name) -> its file ("": none).
    c.data.paths = ml_collections.ConfigDict(dict.fromkeys(FILE_SOURCES, ""))
    # Held-out questions of file sources (data/splits.py), never trained on: a second
    # file per source (source -> path), or this share of each file by a seeded hash
    # of the question id (1.0: all of it, an evaluation-only config).
    c.data.eval_paths = ml_collections.ConfigDict(dict.fromkeys(FILE_SOURCES, ""))
    c.data.eval_fraction = 0.0
    c.data.split_seed = 0
    # JSON {question id: [document ids]}: those questions search only those documents.
    c.data.search_whitelist = ""
    # The synthetic world's seed (organisations, corpus, every split's tasks),
    # apart from `seed` so that runs of different training seeds learn the same
    # world and are evaluated on the same held-out tasks.
    c.data.synthetic_seed = 0
    c.data.synthetic_num_entities = 400
    c.data.num_train_tasks = 4096  # synthetic: training tasks generated.
    c.data.eval_split = "heldout"
    # "" or a task field ("domain", "answer_type"): every step's tasks keep the
    # mixture's proportions of that field's values instead of varying by chance.
    c.data.stratify_by = ""
    # "value:weight,..." over data.stratify_by's values: scales each one's share
    # of the training tasks (e.g. "logic:2"); evaluation tasks are not reweighted.
    c.data.stratum_weights = ""

    # --- tools, prices, preferences ---------------------------------------------
    # --- the environment: tasks, tools, grading ---------------------------------------
    c.env = ml_collections.ConfigDict()
    # A registered environment (envs/environment.py; "synthetic": the offline world of
    # simulated experts, BM25 search and a sandbox; "tau2": τ²-bench conversations;
    # "routed": several at once, see env.members) or "package.module:factory", a
    # factory of one's own taking envs/inputs.EnvInputs (the sections it reads).
    c.env.name = "synthetic"
    # env.name="routed": the environments of a mixture, the default first. A task
    # names its own in metadata["env"] (τ² tasks: "tau2"); the others go to the default.
    c.env.members = ""
    # τ²-bench (envs/tau2/env.py; needs the tau2 extra, see setup.py).
    c.env.tau2 = ml_collections.ConfigDict()
    c.env.tau2.data_dir = ""  # tau2's data folder ("": $TAU2_DATA_DIR).
    c.env.tau2.domain = ""  # The domain Environment.tasks() reads; runs read data.sources.
    # Where domains that tau2 lacks (ToolScale's ten, e.g. env.tau2.domain=bank) are found
    # as folders (envs/tau2/domain_folder.py); env.tau2.domain may also be a folder's path.
    c.env.tau2.domains_dir = ""
    # A folder domain's code runs in the sandbox (envs/sandboxed_domain.py; tools.sandbox),
    # unless tools.code_is_trusted, or it is one of ToolScale's ten in domains_dir (the
    # release's own code) and this is True: then it is imported into the trainer (faster).
    c.env.tau2.release_domains_in_process = True
    # The user: "simulator" (tau2's user simulator at user_url, any OpenAI-compatible
    # server) or "scripted" (the scenario's reason for calling, a confirmation, stop).
    c.env.tau2.user = "simulator"
    c.env.tau2.user_url = "https://api.openai.com/v1"
    c.env.tau2.user_model = "gpt-5"  # The reference release's user simulator.
    c.env.tau2.user_api_key_env = "OPENAI_API_KEY"  # "": servers without authentication.
    c.env.tau2.user_temperature = 0.0  # tau2's default.
    c.env.tau2.user_price_in = 1.25  # USD per million tokens (gpt-5), recorded apart.
    c.env.tau2.user_price_out = 10.0
    c.env.tau2.user_retries = 3  # Then the episode ends with the error recorded.
    c.env.tau2.max_steps = 40  # The reference release's budget (tau2's CLI default: 200).
    c.env.tau2.max_errors = 10  # tau2's default.
    # "ask_expert": experts the policy may consult (priced per alias), served at
    # expert_url; "": the policy acts alone.
    c.env.tau2.meta_tools = ""
    c.env.tau2.expert_url = ""
    c.env.tau2.expert_served_model = ""  # "": each expert is served under its own name.
    c.env.tau2.expert_api_key_env = ""
    # What an expert's reply is (docs/reproduction.md, "τ² conversations"): "advise"
    # (the tool ask_expert: advice the policy reads, every action the policy's own)
    # or "act" (the tool call_expert, the reference's: the expert reads the
    # conversation and the domain's tools and its reply is the agent's action, a
    # tool call run in tau2 or a message to the user).
    c.env.tau2.expert_mode = "advise"
    # Domain tools kept from the policy, comma-separated ("": every tool; the
    # reference's: "transfer_to_human_agents"). An acting expert still has them.
    c.env.tau2.drop_tools = ""
    # False: turns that message the user (no tool call) get no loss, as in the
    # reference; True: every turn trains.
    c.env.tau2.train_message_turns = True
    # Natural-language assertions in a task's reward basis: "skip" (left out of the
    # reward, and said so per episode) or "judge" (tau2's judge at judge_url).
    c.env.tau2.nl_assertions = "skip"
    c.env.tau2.judge_url = ""
    c.env.tau2.judge_model = ""
    c.env.tau2.judge_api_key_env = ""
    c.tools = ml_collections.ConfigDict()
    # Tools every task offers: meta-tools, plain tools ("python") or "package.module:attr".
    c.tools.enabled = "search,enhance_reasoning,answer"
    # True: sample aliases, prices and preferences per task. False: every task gets
    # the nominal configuration, the same for every seed: each model of the
    # catalogue at its own prices and latencies, in catalogue order, preference
    # weights at the middle of their ranges (tools/config_sampler.py `nominal`).
    c.tools.randomize = True
    c.tools.price_scale_min = 0.5  # Price multipliers sampled log-uniformly.
    c.tools.price_scale_max = 2.0
    c.tools.latency_scale_min = 0.5
    c.tools.latency_scale_max = 2.0
    c.tools.keep_probability = 0.75  # Chance each model is offered under its tool.
    c.tools.shuffle_aliases = True  # Aliases say nothing about quality (paper).
    c.tools.cost_weight_max = 1.0  # Preference weights drawn from U(0, max).
    c.tools.latency_weight_max = 1.0
    c.tools.efficiency_off_prob = 0.2  # Chance a task cares about accuracy only.
    c.tools.preference_prob = 0.2  # Chance a task states a tool preference.
    c.tools.sleep_scale = 0.0  # Simulated tools really sleep latency × this.
    c.tools.description_style = "full"  # "full" (paper) | "compact" (short CPU prompts).
    # Where model-written code runs (tools/sandbox/registry.py): "auto" picks the
    # first of bwrap (Linux namespaces) and wasm (CPython for WASI in wasmtime)
    # that runs here; "rlimits" limits resources only and needs code_is_trusted.
    c.tools.sandbox = "auto"
    c.tools.code_is_trusted = False  # True: a sandbox with open escapes may run it.
    # Charge the sandbox's and the retriever's measured wall time (code cost,
    # latency), and a failing tool's. False: offline rewards depend on the seed
    # only, not on machine load, so runs repeat and a resumed run retraces an
    # uninterrupted one.
    c.tools.charge_measured_time = True
    # Run each distinct program once (tools/sandbox/cache.py): only where every
    # program's output is a function of its text, as the offline experts' are.
    c.tools.memoize_code = False
    # Experts per meta-tool (tools/live_backends.py): "offline" (simulated, they read
    # the gold answer: synthetic data only), "live" (the catalogue's models over
    # HTTP), or a default with overrides ("live,answer=offline").
    c.tools.backends = "offline"
    c.tools.catalogue = PAPER_CATALOGUE  # Models, endpoints, keys, prices (live tools).
    c.tools.expert_max_tokens = 2048  # Per expert reply.
    c.tools.expert_temperature = 0.0
    # How a live expert is asked and its reply read (tools/experts/protocols.py):
    # "project" (its role's system prompt, the task, documents, intermediate results
    # and the orchestrator's last 2,000 characters; tools.expert_temperature; an empty
    # answer is an error and the episode goes on) or "reference" (the released code's
    # sub-agents: only the problem and the documents within the model family's budget
    # (the catalogue's `family`), <query>/```python/\boxed{}/<answer> replies, code run
    # for 60 s, temperature 1.0 for gpt and 0.2 otherwise, any answer ends the
    # episode), or "package.module:attr".
    c.tools.experts = "project"
    c.tools.expert_retries = 3  # After a 429/5xx/timeout, with exponential backoff.
    c.tools.expert_timeout_s = 600.0  # Per attempt.
    # Retrieval behind `search` (env "qa"): "index" (tools.search_index), "tavily",
    # or "index+tavily" (Tavily when fewer than search_min_docs survive a whitelist).
    c.tools.search = "index"
    c.tools.search_index = ""  # A folder from python -m orchestra_jax.tools.build_index.
    c.tools.search_min_docs = 3
    c.tools.search_top_k = 3  # Documents each search returns.
    # A document as the orchestrator and experts read it: "title_text" ("title: text")
    # or "content" (the reference's: the retriever's text as it is, no title).
    c.tools.document_text = "title_text"
    # What a search costs (tools/retrieval/search_pricing.py): "per_document" (the prices above,
    # per query and per returned document) or "reference" (the reference's: a web
    # engine's search + top_k extractions; a local index, the query's tokens at the
    # orchestrator's input price).
    c.tools.search_pricing = "per_document"
    # USD per search call and per document it returns (web search's prices).
    c.tools.search_price_per_query = pricing.SEARCH_PRICE_PER_QUERY
    c.tools.search_price_per_document = pricing.SEARCH_PRICE_PER_DOCUMENT

    # --- reward ----------------------------------------------------------------
    c.reward = ml_collections.ConfigDict()
    # "preference" (paper) | "efficiency" | "outcome" | "utility" (the held-out
    # evaluation's reward) | "toolorchestra_reference" (the released code's reward,
    # quirks included; docs/reproduction.md) | "package.module:factory"
    # (rewards/registry.py).
    c.reward.type = "preference"
    c.reward.efficiency_alpha = 1.0  # efficiency: 1 - alpha·cost - beta·latency.
    c.reward.efficiency_beta = 0.0
    c.reward.efficiency_floor = 0.0
    # utility's scales: the held-out reward's (one value, set either field).
    c.reward.cost_scale_usd = cost_scale_usd
    c.reward.latency_scale_s = latency_scale_s
    # The LLM judge of free-form answers (answer_type "judge": FRAMES, GeneralThought,
    # HLE), in training and evaluation, after an exact-match check. Empty base_url: none.
    c.reward.judge = ml_collections.ConfigDict()
    c.reward.judge.base_url = ""  # OpenAI-compatible, e.g. https://api.openai.com/v1
    c.reward.judge.model = ""
    c.reward.judge.api_key_env = ""  # Empty: the server needs no key.
    c.reward.judge.price_in = 0.0  # USD per million tokens: grading cost, reported apart.
    c.reward.judge.price_out = 0.0
    c.reward.judge.prompt = "reference"  # "reference" (the release's layout) | "project".
    # The exact match that settles an answer before the judge is asked, in training:
    # "normalized" (lower case, punctuation and articles dropped) or "lowercase" (the
    # release's strip().lower() equality). eval.protocol decides it in evaluations.
    c.reward.judge.answer_match = "normalized"
    c.reward.judge.max_tokens = 512
    # An OpenAI reasoning model (gpt-5, o-series): max_completion_tokens, no temperature.
    c.reward.judge.reasoning_model = False
    c.reward.judge.retries = 3  # Then the episode is an infrastructure failure, naming the judge.
    c.reward.judge.timeout_s = 300.0  # Per attempt.
    c.reward.judge.extra_body = ml_collections.ConfigDict()  # Merged into every request.

    # --- GRPO ------------------------------------------------------------------
    c.rl = ml_collections.ConfigDict()
    c.rl.group_size = 8
    c.rl.tasks_per_step = 16
    c.rl.lr = 1e-6
    c.rl.schedule = "constant"  # "constant" | "cosine" | "linear" (to 0 at num_steps).
    c.rl.warmup_steps = 0
    c.rl.weight_decay = 0.01
    c.rl.grad_clip = 1.0
    # Rows per micro-batch on each batch shard (mesh.data x mesh.fsdp devices): a
    # micro-batch is micro_batch_size x shards rows, so any mesh divides it.
    c.rl.micro_batch_size = 8
    # Keep one copy of each group's prompt in the learner batch and run it once
    # (rl/shared_prompts.py): exact, and cheaper where prompts are a large part of
    # each episode. Rows, and so rl.micro_batch_size, then count groups, not episodes.
    c.rl.share_prompts = False
    # Pack several samples into each learner row (rl/batching.py pack_batch): segment ids
    # keep them apart, so loss and gradients are those of one sample a row, with far
    # fewer padded positions where sample lengths differ (turns). Rows then hold
    # rl.seq_buckets' best-fitting length and rl.micro_batch_size counts packed rows.
    # Not with rl.share_prompts (its rows are groups) nor "seq-mean-token-sum-norm".
    c.rl.pack = False
    # With rl.pack, the GRPO learner's samples that begin alike (a rebuilt prompt's
    # turns, a group's episodes) are written once up to where they part, each sample's
    # rest after it seeing that copy (rl/prefix_packing.py): exact, and fewer positions
    # to run. The warm start packs without it.
    c.rl.share_prefixes = False
    # PPO mini-batches: each rollout batch is split into num_minibatches mini-batches,
    # each one optimizer update, gone over num_epochs times; 1 and 1: one update a
    # step (the PPO ratio stays 1 and the clips never act; the paper's setting).
    c.rl.num_minibatches = 1
    c.rl.num_epochs = 1
    # Samples per PPO update, over all hosts (0: rl.num_minibatches sets them): N
    # samples make ceil(N / minibatch_size) updates an epoch, of minibatch_size samples
    # in order and the remainder last (its loss scaled by remainder / minibatch_size),
    # the old log-probs the learner's before the first (the reference: 16). Needs a
    # constant schedule.
    c.rl.minibatch_size = 0
    # The order samples enter those mini-batches (rl/minibatch_order.py): 0 keeps the
    # rollout order; P > 0 is the reference's _balance_batch over P GPUs (16), in
    # sequence-parallel groups of balance_group_size (2). Needs rl.minibatch_size.
    c.rl.balance_partitions = 0
    c.rl.balance_group_size = 2
    # What one learner sample is (rl/samples.py SAMPLE_UNITS, or "package.module:attr"):
    # "episode", a whole episode, its loss over every generated token; "turn", one
    # turn, the prompt the engine was given and the tokens it generated, with its
    # episode's advantage (the reference's).
    c.rl.sample_unit = "episode"
    # Asynchronous GRPO (training/async_loop.py): rollouts of the next steps are played
    # while the learner trains, at most this many policy versions behind (0: rollouts,
    # update and weight sync in turn, the on-policy loop).
    c.rl.max_staleness = 0
    # A group whose oldest turn is further behind (the engine lagging a weight update):
    # "regenerate" plays it again on the current weights, "drop" leaves it out.
    c.rl.stale_groups = "regenerate"
    c.rl.rollout_restarts = 3  # A failed rollout producer is restarted this often in a row.
    # The longest the learner waits on the rollout producer (a step's rollouts, a weight
    # update reaching the engine) before the run stops with an error naming who waits
    # for whom: a bound on a deadlock, above any step's longest rollouts.
    c.rl.async_wait_timeout_s = 3600.0
    # With rollout.engine="jax": weight updates land between decode chunks, turns in
    # flight continue on the new weights and record both versions (partial rollouts).
    c.rl.partial_rollouts = True
    c.rl.loss = "ppo_clip"  # A policy loss of rl/grpo.py POLICY_LOSSES, or "package.module:fn".
    c.rl.clip_low = 0.2
    c.rl.clip_high = 0.28
    c.rl.dual_clip = 10.0
    c.rl.kl_coef = 1e-4
    c.rl.kl_type = "mse"
    c.rl.loss_agg = "token-mean"
    # "grpo": (r − mean) / std within each group (paper). "dr_grpo": r − mean, so
    # a group whose rewards barely differ gives a small update, not a full-scale one.
    c.rl.advantage = "grpo"
    c.rl.adv_clip = 3.0
    c.rl.filter_reward_std = 0.1  # Drop groups whose reward std is at most this.
    # Malformed tool calls: "turn" (reference) drops those turns from the loss,
    # "episode" drops the whole episode, "off" trains on them, "penalty" trains on
    # them with reward rl.format_penalty (below any well-formed episode's).
    c.rl.format_filter = "turn"
    c.rl.format_penalty = grpo.DEFAULT_FORMAT_PENALTY  # Used by format_filter="penalty" only.
    c.rl.filter_no_answer = False  # Drop groups where nobody answered.
    # True: an episode that did not answer (no `answer` call returned one; in a
    # conversation, the other party did not end it) contributes no sample, its
    # group's rewards and advantages unchanged (the reference). False: it trains.
    c.rl.drop_no_answer = False
    # Episodes that failed by infrastructure (engine, expert, search, judge, user
    # simulator, τ² evaluator) leave the loss and their group's statistics; a group
    # left with fewer episodes than this is dropped (2: the fewest a group std needs).
    c.rl.min_group_size_after_infra = 2
    # A step where more than this fraction of the episodes failed by infrastructure
    # stops the run, naming the failing endpoints. A quarter: an outage that large
    # is not a passing fault, and what remains of the step is skewed towards the
    # tasks that did not need the failing service.
    c.rl.max_infra_failure_fraction = 0.25
    # Added to every advantage >= 1 (after rl.adv_clip); 0.0: none. The reference's
    # "correct sample advantage boost" is 0.1.
    c.rl.advantage_boost = 0.0
    c.rl.tis_cap = 2.0  # Truncated importance sampling cap (0: off).
    c.rl.lm_head_chunk = 0  # Loss tokens per LM-head chunk (0: as fit 256 MiB of logits).
    c.rl.reference_dtype = ""  # The KL reference's storage dtype ("bfloat16"; "": as the weights).
    c.rl.seq_buckets = (256, 512, 1024, 2048, 4096, 8192)

    # --- supervised warm start ---------------------------------------------------
    c.sft = ml_collections.ConfigDict()
    c.sft.steps = 0  # 0: no warm start (experiments.sft, whose job it is, refuses 0).
    c.sft.lr = 1e-5
    c.sft.schedule = "constant"  # "constant" | "cosine" | "linear" (decay to 0).
    c.sft.warmup_steps = 0
    # > 0: the warm start is the moving average of the parameters over its steps
    # (this decay per step), not the last step's (training/warm_start.py).
    c.sft.ema_decay = 0.0
    c.sft.batch_size = 16
    c.sft.num_demos = 512
    c.sft.demo_policy = "random"  # A router (eval/routers.py) or a "+" mixture of them.
    # "none" | "correct" (imitate solved episodes only) | "best" (play each task
    # sft.demo_best_of times, imitate its solved episode of highest utility).
    c.sft.demo_filter = "none"
    c.sft.demo_best_of = warm_start.DEFAULT_DEMO_BEST_OF

    # --- checkpoints, evaluation, logs ------------------------------------------
    c.checkpoint = ml_collections.ConfigDict()
    # Checkpoint every N GRPO steps (0: never); the final step is always
    # checkpointed, so a finished run can be evaluated, exported and extended.
    c.checkpoint.every_steps = 10
    c.checkpoint.keep = 3
    c.eval = ml_collections.ConfigDict()
    # Evaluate the policy every N GRPO steps, into eval_steps/ (0: never); the final
    # step is always evaluated, by the held-out evaluation after training.
    c.eval.every_steps = 0
    # The evaluation's settings as one named set (training/eval_protocols.py):
    # "heldout": the project's generalisation test, held-out prices with a stated
    # preference per task and the fields below and in agent.*; "paper": the reference
    # release's evaluation, the catalogue's table as listed (models_paper.yaml), no
    # preference text, temperature 1.0, 50 rounds, one trial, τ² 200 steps, lower-case
    # exact match before the judge (docs/reproduction.md, "Evaluation protocol").
    c.eval.protocol = "heldout"
    c.eval.num_tasks = 64
    c.eval.num_trials = 1  # Episodes per held-out task; > 1 reports pass^k (τ²).
    # Held-out tool configurations, baseline routers' draws and evaluation
    # sampling: fixed across training seeds, so every policy meets the same test.
    c.eval.seed = 0
    c.eval.baselines = "always_strongest,always_cheapest,random"
    c.eval.temperature = 0.0  # 0: greedy decoding.
    # Held-out reward: correct * max(0, 1 - P_cost*cost/scale - P_latency*latency/scale).
    c.eval.cost_scale_usd = cost_scale_usd
    c.eval.latency_scale_s = latency_scale_s
    c.log = ml_collections.ConfigDict()
    c.log.trajectories_every = 1  # Write trajectories JSONL every N steps.
    c.log.tensorboard = True
    return c


def _demo(c):
    # Notes on each choice: docs/notes/ (docs/notes/README.md lists them by topic).
    # The demo preset halved in width and depth (~1M parameters): seconds a step on 2 cores.
    c.model.preset = "demo"
    c.model.overrides.hidden_size = 128
    c.model.overrides.intermediate_size = 384
    c.model.overrides.num_hidden_layers = 2
    c.model.overrides.head_dim = 32
    # Fixed alias order, all models offered, one-line prices: a tiny policy learns which
    # alias suits which domain before it could learn to read price tables.
    c.tools.keep_probability = 1.0
    c.tools.shuffle_aliases = False
    c.tools.description_style = "compact"
    # GRPO steps of ~5 s on 2 cores: the warm start, the five held-out evaluations and
    # the compiles take the rest of a run's ten minutes.
    c.num_steps = 50
    c.rollout.max_seq_len = 1536
    c.agent.max_turns = 4
    c.agent.max_context_tokens = 1536
    c.agent.max_new_tokens_per_turn = 48
    c.agent.tool_timeout_s = 30.0
    c.agent.max_concurrent_episodes = 64  # Routers' calls would queue past the timeout.
    c.agent.seconds_per_generated_token = 0.02  # An 8B model at 50 tokens/s.
    c.tools.charge_measured_time = False  # Rewards a function of the seed alone.
    c.tools.memoize_code = True  # The simulated experts' programs are pure.
    # Most calls of a ~1M-parameter policy at T=1 are malformed; evaluated as trained.
    c.rollout.temperature = 0.5
    c.eval.temperature = 0.5
    c.rl.tasks_per_step = 4  # G = 8 (the default): a logic group often holds a frontier answer.
    c.rl.lr = 2e-4
    c.rl.warmup_steps = 2
    c.rl.schedule = "cosine"  # The last updates, which decide the result, move least.
    # KL to the warm start: domains share the answer choice; this keeps logic's.
    c.rl.kl_coef = 0.3
    c.rl.share_prompts = True  # Each group's ~670-token prompt runs once, not 8 times.
    c.rl.micro_batch_size = 2  # Groups per device: 16 episodes.
    # Two PPO updates a step of 32 episodes, 16 each: the reference's mini-batch size.
    c.rl.num_minibatches = 2
    c.data.stratify_by = "domain"  # Every step holds all three domains.
    c.data.stratum_weights = "logic:2"  # Logic pays for the frontier answer: twice its share.
    c.rl.filter_reward_std = 0.0
    c.rl.format_filter = "episode"  # "turn" let the tiny policy's call format drift.
    # Shared prompts (630-710 tokens) and replies (200-400) in steps of 64; whole
    # episodes (the warm start's) in blocks of 256, the causal attention's block.
    c.rl.seq_buckets = tuple(range(64, 769, 64)) + (1024, 1280, 1536)
    # Warm start: the cheapest search and reasoner, a random answer model; of each
    # task's 4 plays the solved one of highest utility (best-of-n behaviour cloning).
    c.sft.demo_policy = "random_answer"
    c.sft.demo_filter = "best"
    c.sft.steps = 100
    c.sft.lr = 5e-3
    c.sft.ema_decay = 0.9  # The average over ~10 steps, not the last step's swing.
    c.sft.batch_size = 8
    c.checkpoint.every_steps = 8
    c.eval.num_tasks = 192  # At 96 the evaluation's own noise was as large as the seed spread.
    return c


def _micro(c):
    c = _demo(c)
    c.model.preset = "tiny"
    c.model.overrides = {
        "vocab_size": 4096,  # The bundled tokenizer's ids.
        "max_position_embeddings": 4096,
    }
    c.num_steps = 2
    c.rl.schedule = "constant"  # Two steps are all warm-up; nothing is left to decay.
    c.rl.group_size = 2
    c.rl.tasks_per_step = 2
    # One group per device per micro-batch (rl.share_prompts): 8 rows on the
    # tests' 8 fake CPU devices.
    c.rl.micro_batch_size = 1
    c.rl.num_minibatches = 1  # One update a step of 4 episodes; tests that need more set them.
    c.rollout.max_batch_size = 4
    c.agent.max_turns = 2
    c.agent.max_new_tokens_per_turn = 32  # Router calls fit.
    # A random policy writes no well-formed call; keep its episodes so that tests
    # with an injected reward exercise the update.
    c.rl.format_filter = "off"
    c.sft.steps = 0
    c.sft.demo_policy = "random"  # Two turns cannot hold the demo's three-call plans.
    c.sft.demo_filter = "none"  # Tests' tiny warm starts need no solved episode.
    c.checkpoint.every_steps = 1
    c.eval.num_tasks = 4
    c.eval.baselines = ""
    c.log.tensorboard = False
    return c


def _live(c):
    """The paper's live setup: QA tasks from files, the catalogue's experts over HTTP,
    a search index, the sandbox, an LLM judge (docs/live_setup.md)."""
    c.env.name = "qa"
    c.tools.backends = "live"
    c.tools.catalogue = PAPER_CATALOGUE  # gpt-5 / gpt-5-mini need $OPENAI_API_KEY.
    c.tools.search = "index"
    c.tools.search_index = "/data/search_index"  # build_index over your corpus (jsonl).
    c.tools.search_top_k = 50  # The reference's retrieval depth.
    # A local index returns documents for nothing; a search is charged Tavily's $0.01.
    c.tools.search_price_per_document = 0.0
    c.agent.tool_timeout_s = 900.0  # A frontier expert call with retries.
    # Live costs and latencies are measured: the orchestrator's turns, the sandbox,
    # the retriever, failing calls (whatever a base variant set for offline runs).
    c.agent.seconds_per_generated_token = 0.0
    c.tools.charge_measured_time = True
    c.tools.memoize_code = False  # Live experts' programs are not known to be pure.
    # Training data: GeneralThought QA (the paper also trains on ToolScale, the tau2
    # environment's); HLE and FRAMES are for experiments/evaluate.py, all questions.
    c.data.sources = "generalthought"
    c.data.paths.generalthought = "/data/GeneralThought-430K.parquet"
    c.data.paths.hle = "/data/hle.parquet"  # id, question, answer, answer_type, category
    c.data.paths.frames = "/data/frames.jsonl"  # as ../shared/reference/frames.jsonl
    c.data.eval_fraction = 0.01  # Held-out GeneralThought questions (by id hash).
    c.reward.judge.base_url = "https://api.openai.com/v1"
    c.reward.judge.model = "gpt-5"  # The reference's judge.
    c.reward.judge.api_key_env = "OPENAI_API_KEY"
    c.reward.judge.price_in = 1.25
    c.reward.judge.price_out = 10.0
    c.reward.judge.reasoning_model = True
    # A reasoning model's completion limit counts its reasoning tokens as well.
    c.reward.judge.max_tokens = 4096
    c.tools.expert_max_tokens = 8192
    c.eval.num_tasks = 256
    # The catalogue's strongest model answering at once (the paper's "GPT-5" row),
    # the cheapest three-step plan, and random plans.
    c.eval.baselines = "direct_strongest,always_cheapest,random"
    c.eval.cost_scale_usd = 0.2  # A frontier call with long context costs cents.
    c.eval.latency_scale_s = 600.0
    return c


def _live_tiny(c):
    """`_live` on a 2-core CPU: every expert and the judge are one tiny model served by
    `python -m orchestra_jax.rollout.server --model demo --tokenizer demo --port 30100`
    (models_local.yaml), the search index is built from experiments/data/live_tiny_corpus.jsonl
    and the tasks are FRAMES rows (commands: docs/live_setup.md)."""
    c = _live(_micro(c))
    c.tools.catalogue = LOCAL_CATALOGUE
    c.tools.search_index = os.path.join(REPO_DIR, "runs", "live_tiny_index")
    c.tools.search_top_k = 2
    c.tools.expert_max_tokens = 16  # A random model never stops: keep its replies short.
    c.tools.expert_retries = 2
    c.tools.expert_timeout_s = 60.0
    c.agent.tool_timeout_s = 120.0
    c.agent.max_turns = 3  # Room for a router's search, reasoning and answer.
    c.agent.max_context_tokens = 2048  # A FRAMES question, two documents, three turns.
    # agent.context="rebuild": a turn's rebuilt prompt and its reply fit that context.
    c.agent.rebuild.context_tokens = 1024
    c.agent.rebuild.prompt_tokens = 1536
    c.rollout.max_seq_len = 2048
    c.rl.seq_buckets = (256, 512, 768, 1024, 1536, 2048)
    c.data.stratify_by = ""  # One domain (frames): nothing to stratify.
    c.data.stratum_weights = ""
    c.data.sources = "frames"
    c.data.paths.frames = os.path.join(
        os.path.dirname(REPO_DIR), "shared", "reference", "frames.jsonl"
    )
    c.data.eval_fraction = 0.5
    c.reward.judge.base_url = "http://127.0.0.1:30100/v1"
    c.reward.judge.model = "tiny-judge"
    c.reward.judge.api_key_env = ""
    c.reward.judge.price_in = 0.0
    c.reward.judge.price_out = 0.0
    c.reward.judge.max_tokens = 8
    c.reward.judge.reasoning_model = False
    c.reward.judge.retries = 2
    c.reward.judge.timeout_s = 60.0
    c.reward.judge.extra_body = {"chat_template_kwargs": {"enable_thinking": False}}
    c.eval.num_tasks = 2
    c.eval.baselines = "direct_strongest,always_cheapest"
    return c


def _tau2_demo(c):
    """τ²-bench's `mock` domain on CPU. With tau2's user simulator instead of the
    script, serve a tiny model first (python -m orchestra_jax.rollout.server --model
    demo --tokenizer demo --port 30000) and set env.tau2.user=simulator."""
    c.model.preset = "demo"  # ~1M parameters, as the demo's.
    c.model.overrides.hidden_size = 128
    c.model.overrides.intermediate_size = 384
    c.model.overrides.num_hidden_layers = 2
    c.model.overrides.head_dim = 32
    c.env.name = "tau2"
    c.env.tau2.data_dir = "../shared/tau2-bench/data"  # Run from the repository root.
    c.env.tau2.domain = "mock"  # Short policy and few tools: prompts fit a CPU budget.
    c.env.tau2.user = "scripted"
    c.env.tau2.user_url = "http://127.0.0.1:30000/v1"  # For user=simulator.
    c.env.tau2.user_model = "demo"
    c.env.tau2.user_api_key_env = ""
    c.env.tau2.user_price_in = 0.0  # A local model.
    c.env.tau2.user_price_out = 0.0
    c.data.sources = "tau2"
    c.data.paths.tau2 = "../shared/tau2-bench/data/tau2/domains/mock"
    c.num_steps = 4
    c.rollout.max_seq_len = 2048
    c.agent.max_turns = 6
    c.agent.max_context_tokens = 2048
    c.agent.max_new_tokens_per_turn = 48
    c.agent.seconds_per_generated_token = 0.02  # Latency as an 8B model at 50 tokens/s.
    c.tools.description_style = "compact"
    c.rl.group_size = 4
    c.rl.tasks_per_step = 2
    c.rl.lr = 1e-4
    c.rl.micro_batch_size = 4
    c.rl.filter_reward_std = 0.0  # Train on whatever signal a random policy finds.
    c.rl.format_filter = "off"
    c.rl.seq_buckets = (512, 1024, 1536, 2048)
    c.checkpoint.every_steps = 2
    # Half the mock domain's 10 tasks are held out (data/splits.py): evaluated, never
    # trained on.
    c.data.eval_fraction = 0.5
    c.eval.num_tasks = 10  # Every held-out task.
    c.eval.num_trials = 2  # pass^1 and pass^2.
    c.eval.temperature = 1.0  # Trials differ only by sampling.
    c.eval.baselines = ""  # The QA routers' plans do not apply to conversations.
    c.log.tensorboard = False
    return c


def _toolscale_demo(c):
    """ToolScale's school domain (../shared/toolscale/domains/school) on CPU, on the
    tasks `experiments/configs/synthesize.py:demo` writes from its recorded replies."""
    c = _tau2_demo(c)
    c.env.tau2.domain = "school"  # 11 tools; policy and tools make ~6.5k-token prompts.
    c.env.tau2.domains_dir = "../shared/toolscale/domains"  # Run from the repository root.
    c.data.sources = "toolscale"
    c.data.paths.tau2 = ""
    c.data.paths.toolscale = "experiments/data/toolscale_demo/tasks.json"
    c.num_steps = 2
    c.rollout.max_seq_len = 8192
    c.agent.max_context_tokens = 8192
    c.agent.max_turns = 4
    c.agent.max_new_tokens_per_turn = 32
    c.rl.group_size = 2
    c.rl.tasks_per_step = 2
    c.rl.seq_buckets = (8192,)
    c.rl.micro_batch_size = 2
    c.data.eval_fraction = 0.4  # Of the 5 tasks, held out by id hash, each with its evolved
    # twin (data/splits.py): 3 held out (school-000-0 and its twin, school-002-0), 2 trained.
    c.eval.num_tasks = 5  # Every held-out task.
    c.eval.num_trials = 2  # pass^1 and pass^2.
    return c


def _qwen3_0p6b(c):
    c = _live(c)
    c.model.hf_path = "/path/to/Qwen3-0.6B"  # Set with --config.model.hf_path.
    c.tokenizer = "/path/to/Qwen3-0.6B"
    c.model.dtype = "bfloat16"
    c.rollout.max_seq_len = 8192
    c.agent.max_turns = 10
    c.agent.max_context_tokens = 8192
    c.agent.max_new_tokens_per_turn = 1024
    c.agent.enable_thinking = True
    c.rl.group_size = 8
    c.rl.tasks_per_step = 8
    c.rl.lr = 1e-6
    c.rl.micro_batch_size = 4
    return c


def _qwen3_8b_shape(c):
    """Qwen3-8B on TPU pods / GPU clusters behind an SGLang rollout server, the paper's
    live experts, search and judge (`_live`), 16 tasks x G=8 a step."""
    c = _live(c)
    c.model.hf_path = "/path/to/Qwen3-8B"
    c.tokenizer = "/path/to/Qwen3-8B"
    c.model.param_dtype = "float32"
    c.model.dtype = "bfloat16"
    c.model.scan_layers = True
    c.model.remat = "full"
    c.rollout.engine = "sglang"
    c.rollout.urls = "http://127.0.0.1:30000"
    c.rollout.weights_dir = "/tmp/orchestra_jax_weights"
    c.agent.enable_thinking = True  # Qwen3's template default, as the release renders it.
    c.rl.micro_batch_size = 1  # One 32k-token sample per device per micro-batch.
    c.num_steps = 1000
    # A ToolScale mixture (the paper's τ² training data) beside the QA sources:
    #   --config.env.name=routed --config.env.members=qa,tau2
    #   --config.data.sources=<QA sources>,toolscale:1 --config.data.paths.toolscale=<file>
    # τ² episodes then talk to tau2's user simulator (env.tau2.user_*: gpt-5 at
    # OpenAI by default) within tau2's step budget (env.tau2.max_steps).
    return c


def _qwen3_8b(c):
    """The reference release's training recipe (docs/reproduction.md). Files are the
    release's, under training/: sh = train_orchestrator.sh, yaml =
    verl/trainer/config/ppo_trainer.yaml, gen = lead_agent/llm_agent/generation_quick3.py."""
    c = _qwen3_8b_shape(c)
    c.agent.context = "rebuild"  # Each turn's prompt rebuilt from the task (gen run_llm_loop).
    c.agent.tool_calls = "reference"  # Calls read as gen 2104-2129 reads them.
    c.agent.accounting = "reference"  # Charged as gen 2041, 2074-2075, 1282, 1337.
    c.agent.rebuild.programs = "stdout"  # Programs that printed, verbatim (gen 234-235, 2024).
    c.agent.rebuild.cut = "reference"  # cut_seq's decode, special tokens skipped (gen 103).
    c.tools.document_text = "content"  # The retriever's text as it is (gen 592-595).
    c.tools.search_pricing = "reference"  # Search + extract x top_k, or query tokens (gen 563).
    c.tools.search_price_per_document = pricing.SEARCH_PRICE_PER_DOCUMENT  # Tavily's extract.
    c.rl.sample_unit = "turn"  # Each turn a sample, its episode's advantage (gen).
    c.rl.pack = True  # Turns of uneven lengths share rows (exact; verl removes padding too).
    c.rl.share_prefixes = True  # A step's turns share their rebuilt prompts' starts (exact).
    c.rl.minibatch_size = 16  # Samples per update over all GPUs (sh PPO_MINI_BATCH_SIZE).
    c.rl.balance_partitions = 16  # _balance_batch over its 16 GPUs (ray_trainer.py 906-917),
    c.rl.balance_group_size = 2  # Ulysses pairs (sh ulysses_sequence_parallel_size).
    c.rl.num_epochs = 1  # Passes over a step's samples (sh PPO_EPOCHS).
    c.reward.type = "toolorchestra_reference"  # The preference reward as gen computes it.
    c.rl.advantage_boost = 0.1  # sh correct_sample_advantage_boost_value.
    c.rl.drop_no_answer = True  # Rollouts without a valid answer give no sample (gen).
    c.tools.experts = "reference"  # Experts as sub-agents, by model family (gen call_tool).
    c.tools.search_top_k = 30  # Documents per search (sh data.topk_doc).
    c.reward.judge.answer_match = "lowercase"  # strip().lower() before the judge (gen 434).
    # τ² conversations of a ToolScale mixture (docs/reproduction.md, "τ² conversations"):
    c.env.tau2.expert_mode = "act"  # call_expert's reply is the agent's action (gen call_tool).
    c.env.tau2.drop_tools = "transfer_to_human_agents"  # (rollout/tau2 llm_utils generate).
    c.env.tau2.train_message_turns = False  # Turns without a tool call give no sample (gen).
    c.env.tau2.user_temperature = 1.0  # (rollout/tau2/config.py 33, cli.py 106-108).
    c.env.tau2.nl_assertions = "judge"  # Every evaluation type (rollout/tau2/run.py 164),
    c.env.tau2.judge_url = "https://api.openai.com/v1"  # judged by gpt-5 (config.py 37).
    c.env.tau2.judge_model = "gpt-5"
    c.env.tau2.judge_api_key_env = "OPENAI_API_KEY"
    c.eval.protocol = "paper"  # The paper's evaluation (evaluation/eval_hle.py, tau2-bench).
    c.eval.every_steps = 0  # No evaluation during training (sh trainer.test_freq=1000000).
    c.rl.group_size = 8  # Rollouts per task (sh ROLLOUT, rollout.n_agent).
    c.rl.tasks_per_step = 16  # Tasks per step (sh TRAIN_BATCH_SIZE).
    c.rl.lr = 1e-6  # sh LR; constant, no warm-up (yaml optim.warmup_style, lr_warmup_steps).
    c.rl.schedule = "constant"
    c.rl.warmup_steps = 0
    c.rl.weight_decay = 0.01  # AdamW's decoupled weight decay (yaml actor.optim).
    c.rl.grad_clip = 1.0  # Global gradient-norm clip (yaml actor.grad_clip).
    c.rl.clip_low = 0.2  # PPO ratio clip 1 − 0.2 (sh clip_ratio_low).
    c.rl.clip_high = 0.28  # and 1 + 0.28 (sh clip_ratio_high).
    c.rl.dual_clip = 10.0  # Dual-clip bound c for negative advantages (sh clip_ratio_c).
    c.rl.kl_coef = 1e-4  # KL loss to the frozen start (sh kl_loss_coef, use_kl_loss),
    c.rl.kl_type = "mse"  # as ½(logp − ref)² (sh kl_loss_type).
    c.rl.loss_agg = "token-mean"  # Loss mean over tokens (yaml actor.loss_agg_mode).
    # π_old the actor's log-probs (recipe/algo/grpo_ray_trainer_quick3.py compute_log_prob),
    # uncorrected; no entropy bonus (sh ENTROPY=0); AdamW betas 0.9, 0.999 as the learner's.
    c.rl.tis_cap = 0.0
    c.rl.adv_clip = 3.0  # Advantages clipped to ±3 (gen run_llm_loop).
    c.rl.filter_reward_std = 0.1  # Groups whose reward std is ≤ 0.1 give no sample (gen).
    c.rl.format_filter = "turn"  # Malformed turns give no sample (gen).
    c.rollout.temperature = 1.0  # Sampling temperature (sh TEMP), also the loss's.
    c.rollout.top_p = 1.0  # No nucleus cut (yaml rollout.top_p).
    c.rollout.top_k = -1  # No top-k cut (yaml rollout.top_k).
    c.agent.max_turns = 30  # sh +max_turns.
    c.agent.rebuild.prompt_tokens = 24000  # Prompt middle-cut to this (sh max_prompt_length).
    c.agent.max_new_tokens_per_turn = 8768  # Tokens per turn (sh max_response_length).
    c.agent.max_context_tokens = 24000 + 8768  # One turn's prompt and response.
    c.rollout.max_seq_len = 24000 + 8768
    c.rl.seq_buckets = (4096, 8192, 16384, 32768)  # The last holds 24000 + 8768.
    c.checkpoint.every_steps = 1  # sh trainer.save_freq.
    # num_steps: 10 epochs of one's tasks / 16 (sh trainer.total_epochs); 1000 here.
    return c


def _qwen3_8b_project(c):
    """Qwen3-8B with the paper's hyperparameters (G=8, 16 tasks a step, lr 1e-6, clip
    0.2/0.28, dual clip 10, KL 1e-4 as ½Δ², 30 turns, 24k-token prompts and 8768-token
    responses) and the project's own choices: one growing sequence per episode, its
    preference reward, its experts, the held-out evaluation."""
    c = _qwen3_8b_shape(c)
    c.rollout.max_seq_len = 24576 + 8768
    c.agent.max_turns = 30
    c.agent.max_context_tokens = 24576 + 8768
    c.agent.max_new_tokens_per_turn = 8768
    c.rl.group_size = 8
    c.rl.tasks_per_step = 16
    c.rl.lr = 1e-6
    c.rl.seq_buckets = (4096, 8192, 16384, 33344)  # The last holds 24576 + 8768.
    c.checkpoint.every_steps = 25
    c.eval.every_steps = 50
    return c


def _qwen3_8b_lora(c):
    """`_qwen3_8b`'s recipe on one host (an 8-GPU node or TPU host; `launch.plan`
    says which fit): adapters on every projection train, the base is frozen, and
    the in-process JAX engine samples with base + adapters on the same devices."""
    c = _qwen3_8b(c)
    c.lora.rank = 64
    c.lora.alpha = 128.0  # Adapters scaled by 2.
    c.model.param_dtype = "bfloat16"  # The frozen base: 16 GB, never cast to float32.
    c.rl.lr = 1e-5  # LoRA's usual 10x the full fine-tuning rate (1e-6).
    c.rollout.engine = "jax"  # In process, beside the learner (vllm/sglang take adapters too).
    c.rollout.urls = ""
    c.rollout.weights_dir = ""
    # Sequences the engine decodes at once, 32768 tokens each (4.5 GiB of KV cache
    # apiece): 4 fit one H100 beside the learner, an H200 takes 8 or more.
    c.rollout.max_batch_size = 4
    return c


def _lora_demo(c):
    """The demo with LoRA adapters (rank 8 on every projection) training instead of
    every weight, warm start included."""
    c = _demo(c)
    c.lora.rank = 8
    c.lora.alpha = 16.0  # Adapters scaled by 2.
    c.rl.lr = 2e-3  # LoRA's usual 10x the full fine-tuning rate.
    c.sft.lr = 2e-2
    return c


def get_config(arg: str = "demo") -> ml_collections.ConfigDict:
    variant = (arg or "demo").strip()
    builders = {
        "demo": _demo,
        "micro": _micro,
        "live_tiny": _live_tiny,
        "tau2_demo": _tau2_demo,
        "toolscale_demo": _toolscale_demo,
        "qwen3_0p6b": _qwen3_0p6b,
        "qwen3_8b": _qwen3_8b,
        "qwen3_8b_project": _qwen3_8b_project,
        "qwen3_8b_lora": _qwen3_8b_lora,
        "lora_demo": _lora_demo,
    }
    if variant not in builders:
        raise ValueError(f"unknown config variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    c = builders[variant](_base())
    c.variant = variant
    return c
