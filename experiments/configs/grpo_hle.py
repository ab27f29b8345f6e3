r"""GRPO training of a tool orchestrator (ToolOrchestra, arXiv 2511.21689).

Variants (`--config=experiments/configs/grpo_hle.py:<variant>`):

  demo        tiny random Qwen3 + bundled tokenizer + the offline synthetic
              environment; warm start, GRPO and held-out evaluation on a
              2-core CPU in minutes. The README's main command.
  micro       the smallest config the end-to-end test runs (two GRPO steps).
  qwen3_0p6b  Qwen3-0.6B from a Hugging Face folder, notebooks and single hosts.
  qwen3_8b    Qwen3-8B as in the paper (G=8, 16 tasks per step, lr 1e-6,
              dual clip 10, KL 1e-4 as ½Δ², 30 turns), TPU pods / GPU clusters.

Every field is validated at start-up by `orchestra_jax.training.config_checks`.
Override any field on the command line: `--config.rl.lr=3e-6`.
"""

import ml_collections

from orchestra_jax.rl import grpo
from orchestra_jax.training import warm_start

VARIANTS = ("demo", "micro", "qwen3_0p6b", "qwen3_8b")


def _base() -> ml_collections.ConfigDict:
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
    c.model.overrides = ml_collections.ConfigDict()  # Qwen3Config fields over the preset.
    c.tokenizer = "demo"  # "demo" (bundled) or a folder with tokenizer.json.

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
    c.rollout.engine = "jax"  # "jax" (in process) or "sglang" (servers).
    c.rollout.urls = ""  # sglang: comma-separated server or router URLs.
    c.rollout.weights_dir = ""  # sglang: where HF weights are written per sync.
    c.rollout.max_batch_size = 64  # jax: concurrent sequences in the decode batch.
    c.rollout.max_seq_len = 2048  # jax: KV-cache length per sequence.
    c.rollout.prefix_cache = True  # jax: reuse finished rows' KV for shared prompt prefixes.
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = -1

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

    # --- tasks -----------------------------------------------------------------
    c.data = ml_collections.ConfigDict()
    # Comma-separated `source[:weight]` list; sources are data readers
    # ("synthetic", "frames", "hle", "generalthought", "toolscale", "jsonl").
    c.data.sources = "synthetic"
    c.data.paths = ml_collections.ConfigDict()  # source name -> file path.
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
    c.tools = ml_collections.ConfigDict()
    c.tools.backends = "offline"  # "offline": simulated experts + BM25 + sandbox.
    c.tools.randomize = True  # Sample aliases, prices and preferences per task.
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
    # Model-written code runs under bubblewrap ("bwrap", Linux). "rlimits" only
    # limits resources (no network or file isolation): for trusted set-ups only.
    c.tools.sandbox = "bwrap"
    # Charge the sandbox's and the retriever's measured wall time (code cost,
    # latency), and a failing tool's. False: offline rewards depend on the seed
    # only, not on machine load, so runs repeat and a resumed run retraces an
    # uninterrupted one.
    c.tools.charge_measured_time = True
    # Run each distinct program once (tools/sandbox_cache.py): only where every
    # program's output is a function of its text, as the offline experts' are.
    c.tools.memoize_code = False

    # --- reward ----------------------------------------------------------------
    c.reward = ml_collections.ConfigDict()
    # "preference" (paper) | "efficiency" | "outcome" | "utility" (the held-out
    # evaluation's reward, with eval.cost_scale_usd and eval.latency_scale_s).
    c.reward.type = "preference"
    c.reward.efficiency_alpha = 1.0  # efficiency: 1 - alpha·cost - beta·latency.
    c.reward.efficiency_beta = 0.0
    c.reward.efficiency_floor = 0.0

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
    c.rl.tis_cap = 2.0  # Truncated importance sampling cap (0: off).
    c.rl.seq_buckets = (256, 512, 1024, 2048, 4096, 8192)

    # --- supervised warm start ---------------------------------------------------
    c.sft = ml_collections.ConfigDict()
    c.sft.steps = 0  # 0: no warm start.
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
    c.checkpoint.every_steps = 10
    c.checkpoint.keep = 3
    c.eval = ml_collections.ConfigDict()
    c.eval.every_steps = 0  # Also every N GRPO steps, into eval_steps/ (0: never).
    c.eval.num_tasks = 64
    # Held-out tool configurations, baseline routers' draws and evaluation
    # sampling: fixed across training seeds, so every policy meets the same test.
    c.eval.seed = 0
    c.eval.baselines = "always_strongest,always_cheapest,random"
    c.eval.temperature = 0.0  # 0: greedy decoding.
    # Held-out reward: correct * max(0, 1 - P_cost*cost/scale - P_latency*latency/scale).
    c.eval.cost_scale_usd = 0.02
    c.eval.latency_scale_s = 120.0
    c.log = ml_collections.ConfigDict()
    c.log.trajectories_every = 1  # Write trajectories JSONL every N steps.
    c.log.tensorboard = True
    return c


def _demo(c):
    # The demo preset's layout, halved in width and depth (~1M parameters): on a
    # 2-core CPU every step costs about a second per 16k tokens.
    c.model.preset = "demo"
    c.model.overrides.hidden_size = 128
    c.model.overrides.intermediate_size = 384
    c.model.overrides.num_hidden_layers = 2
    c.model.overrides.head_dim = 32
    # A tiny model learns which alias suits which domain; with the aliases
    # shuffled per task it would first have to learn to read the price tables.
    c.tools.keep_probability = 1.0
    c.tools.shuffle_aliases = False
    c.tools.description_style = "compact"
    c.tokenizer = "demo"
    c.num_steps = 30
    c.rollout.max_batch_size = 64
    c.rollout.max_seq_len = 1536
    c.agent.max_turns = 4
    c.agent.max_context_tokens = 1536
    c.agent.max_new_tokens_per_turn = 48
    c.agent.tool_timeout_s = 30.0
    # Without a bound the warm start's 2048 router episodes all called the
    # sandbox at once, and half the demonstrations held a timed-out call whose
    # count depended on the machine's load (docs/benchmarks.md, session 11).
    c.agent.max_concurrent_episodes = 64
    c.agent.seconds_per_generated_token = 0.02  # An 8B model at 50 tokens/s.
    c.tools.charge_measured_time = False  # Rewards a function of the seed alone.
    c.tools.memoize_code = True  # The simulated experts' programs are pure.
    # A ~1M-parameter policy sampled at T=1 writes mostly malformed calls; T=0.5
    # keeps half of them well-formed (log-probs are taken at the same temperature).
    # Evaluation samples at the same temperature: it scores the policy GRPO trained.
    # Training rollouts at 0.7 (stratified) rescued a warm start that never
    # sampled the frontier model on logic puzzles, but over seeds 0-6 gained
    # +0.034 ± 0.036 against these settings' +0.027 ± 0.017 (session 13).
    c.rollout.temperature = 0.5
    c.eval.temperature = 0.5
    # Eight tries per question: a logic puzzle's group holds a frontier answer
    # more often than with four, so GRPO sees it pay (docs/benchmarks.md).
    c.rl.group_size = 8
    c.rl.tasks_per_step = 4
    c.rl.lr = 2e-4
    c.rl.warmup_steps = 2
    # Decay to 0 at the last step. At a constant rate the shared answer choice
    # kept swinging to the end (session 14's seed 2 answered 18 of 24 logic
    # episodes with the frontier model at step 13 and 1 of 16 at step 20, and
    # its call format broke), so where the run stopped decided the result.
    c.rl.schedule = "cosine"
    # A KL penalty to the warm start (the paper's reference policy, at 3000x its
    # coefficient). Entity and logic questions share the tiny policy's answer
    # choice, so once GRPO moves entity questions to the cheapest model it can
    # drag the logic puzzles along; without the penalty seed 0's logic puzzles
    # left the frontier model in its last two steps (docs/benchmarks.md,
    # session 11). Over five seeds 0.3 gained a little more than 0.1 (session 12).
    # More GRPO steps let the shared choice swing further rather than settle
    # (40 steps: seed 0 ended below its warm start).
    c.rl.kl_coef = 0.3
    # Each group's ~670-token prompt runs once, not eight times (rl/shared_prompts.py);
    # a micro-batch holds 2 groups, 16 episodes, per device.
    c.rl.share_prompts = True
    c.rl.micro_batch_size = 2
    # Every step holds all three domains (the warm start's demonstrations are
    # drawn from the same stream). With 4 tasks drawn at random one step in
    # six held no logic puzzle: such a step can only pay for cheaper answers,
    # and the tiny policy's answer choice is largely shared across domains.
    # With the cosine decay above, GRPO gained on its warm start in 9 of 10
    # seeds, +0.026 ± 0.022 (without both: 5 of 7, +0.024 ± 0.037; see
    # docs/benchmarks.md, session 15).
    c.data.stratify_by = "domain"
    # Twice as many logic puzzles as the world holds, in the demonstrations and
    # in GRPO (half of every step's tasks; held-out tasks keep the world's mix).
    # Logic is the one domain that pays for the frontier answer, and the one
    # whose answer choice is worth most on held-out tasks (about 0.39 a task
    # against 0.11 for entity questions' cheapest-vs-frontier difference); with
    # a third of the tasks its groups were outvoted on the answer choice the
    # domains share, and the seeds whose warm start seldom sampled the frontier
    # answer on logic lost it in GRPO. Over seeds 0-9 GRPO now gains on its warm
    # start in all 10, +0.029 ± 0.013 (0.533 -> 0.562; without the weight 9 of
    # 10, +0.026 ± 0.022 from 0.509; docs/benchmarks.md, session 16). Logic
    # episodes are longer: walls rose to 448-586 s.
    c.data.stratum_weights = "logic:2"
    c.rl.filter_reward_std = 0.0
    # Drop whole episodes with a malformed call (the recorded demo runs used this;
    # "turn" with T=1 rollouts let the tiny policy's call format drift, see
    # docs/benchmarks.md).
    c.rl.format_filter = "episode"
    # Steps of 64 up to 768 fit shared prompts (630-710 tokens) and the episodes'
    # replies (200-400) closely; whole episodes (the warm start's) stay in multiples
    # of 256, the block of the causal attention (models/qwen3_attention.py).
    c.rl.seq_buckets = tuple(range(64, 769, 64)) + (1024, 1280, 1536)
    # The warm start imitates one fixed plan (search, enhance_reasoning, answer)
    # with the cheapest search and reasoning models and an answer model drawn at
    # random: every call is well formed from the start, and a group's rewards
    # differ only by the answer model (and the experts' luck), the choice this
    # environment's questions differ on (the frontier model answers logic
    # puzzles; a cheap one reads off computed and retrieved results). Each task
    # is played sft.demo_best_of times and its solved episode of highest utility
    # kept (best-of-n rejection sampling under the task's own preferences), so
    # the warm start already leans to the right answer model per question, and
    # GRPO turns the lean into a choice. From unfiltered demonstrations GRPO's
    # first move was one answer model for every question, dearer or cheaper
    # depending on the seed (docs/benchmarks.md, sessions 8 to 10). Random-router
    # demonstrations (random tools too) pair a tool with another tool's alias,
    # which a ~1M-parameter policy does not learn to avoid within the budget.
    c.sft.demo_policy = "random_answer"
    c.sft.demo_filter = "best"
    c.sft.steps = 100
    c.sft.lr = 5e-3
    # At this constant learning rate the last step's answer choice swings with
    # the last few batches (logic puzzles to the frontier model 4 % to 79 % of
    # the time from one 10-step mark to the next), so the warm start, and what
    # GRPO can sample from it, was a matter of where the swing ended. The
    # moving average over ~10 steps keeps the demonstrations' lean instead: on
    # the three seeds run both ways it raised every warm start and the trained
    # policy by 0.04 on average, though not GRPO's gain over its warm start
    # (docs/benchmarks.md, session 14).
    c.sft.ema_decay = 0.9
    c.sft.batch_size = 8
    c.sft.num_demos = 512
    c.checkpoint.every_steps = 8
    # 192 held-out tasks: at 96 the evaluation's own noise (paired standard error
    # ~0.025) was as large as the spread of GRPO's gain across seeds.
    c.eval.num_tasks = 192
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


def _qwen3_0p6b(c):
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


def _qwen3_8b(c):
    """The paper's settings (DESIGN.md: Advantage, Loss)."""
    c.model.hf_path = "/path/to/Qwen3-8B"
    c.tokenizer = "/path/to/Qwen3-8B"
    c.model.param_dtype = "float32"
    c.model.dtype = "bfloat16"
    c.model.scan_layers = True
    c.model.remat = "full"
    c.rollout.engine = "sglang"
    c.rollout.urls = "http://127.0.0.1:30000"
    c.rollout.weights_dir = "/tmp/orchestra_jax_weights"
    c.rollout.max_seq_len = 32768
    c.agent.max_turns = 30
    c.agent.max_context_tokens = 24576 + 8768
    c.agent.max_new_tokens_per_turn = 8768
    c.agent.enable_thinking = True
    c.rl.group_size = 8
    c.rl.tasks_per_step = 16
    c.rl.lr = 1e-6
    c.rl.micro_batch_size = 1  # One 32k-token episode per device per micro-batch.
    c.rl.seq_buckets = (4096, 8192, 16384, 32768)
    c.num_steps = 1000
    c.checkpoint.every_steps = 25
    c.eval.every_steps = 50
    return c


def get_config(arg: str = "demo") -> ml_collections.ConfigDict:
    variant = (arg or "demo").strip()
    builders = {"demo": _demo, "micro": _micro, "qwen3_0p6b": _qwen3_0p6b, "qwen3_8b": _qwen3_8b}
    if variant not in builders:
        raise ValueError(f"unknown config variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    c = builders[variant](_base())
    c.variant = variant
    return c
