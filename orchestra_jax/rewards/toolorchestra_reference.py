"""The reward of ToolOrchestra's released training code, quirks included.

`reward.type="toolorchestra_reference"` reproduces what the release computes in
`training/lead_agent/llm_agent/generation_quick3.py`,
`LLMGenerationManager.run_llm_loop` (the block after the rollouts that fills
`tool_counts`, `tool_counts_min` / `tool_counts_max` and `rewards_by_rollout_id`).
The project's default, `preference` (rewards/preference.py), is the paper's
formula with one sign convention; this module is the literal release, for runs
that reproduce it.

For the G episodes of one task (the release's `example_idx`: the task's rollouts,
never the batch) with preference vector P, episode i gets R_i = 0 when it is
wrong, and otherwise the sum of the terms below, every min and max taken over
the group and a term skipped when its max equals its min:

  tools   n_i,f = turns of episode i whose first valid call was tool f (the
          `first_call:tool:<alias>` features, `Turn.first_call_feature`).
          U_f = {j : n_j,f ≥ 1}, the episodes that used f;
              P_f · (n_i,f − min_U n_f) / (max_U n_f − min_U n_f)
          for every tool some episode of the group used.
  accuracy  a_i = 1 (right) or 0; P_acc · (a_i − min a) / (max a − min a).
  cost    c_i = dollars; with min and max over −c,
              P_cost · (c_max + c_i) / (c_max − c_min)   (the explicit term)
            + P_cost ·  c_max        / (c_max − c_min)   (the feature loop's term),
          i.e. P_cost · (2 c_max + c_i) / (c_max − c_min).
  latency ℓ_i = seconds, as cost: P_lat · (2 ℓ_max + ℓ_i) / (ℓ_max − ℓ_min).

Each quirk, as the release has it (all in `run_llm_loop`):

1. First call only: a turn adds 1 to the count of the tool of its first valid
   call (`tool_counts[rollout_id][turn_tools[0][1]] += 1`: the first entry of
   the turn's `tool_summary`, which `LLMGenerationManager.execute_predictions`
   fills with the calls that passed validation and returned, in the order
   written; entry [1] is the `model` alias). A turn's other calls count nothing.
2. A tool's min and max run over the episodes that used it: `tool_counts_min` /
   `tool_counts_max` are filled from the counts that exist, and a count exists
   only once it is incremented. An episode that never used a tool another
   episode used gets (0 − min) / (max − min) < 0 for it; a tool whose users all
   used it equally is skipped, however many episodes never used it.
3. Cost and latency are min-maxed over −c and −ℓ (`tool_counts_min[...]['cost']
   = min(..., -example_costs[rollout_id])`) but the un-negated value is the
   numerator (`cur_cost - tool_counts_min[...]['cost']`), so the term is
   (c_i + c_max) / (c_max − c_min): at least 1 for costs ≥ 0, and higher the
   more the episode spent.
4. Cost and latency are counted twice: 'accuracy', 'cost' and 'latency' are
   keys of `tool_counts_min[example_idx]`, so the loop over its keys (`features
   = list(tool_counts_min[example_idx].keys())`) adds a term for each with the
   rollout's `tool_counts` value, a `defaultdict(int)`'s 0: P_f · (0 − min) /
   (max − min), which is c_max / (c_max − c_min) for cost (and ℓ's for
   latency), a constant every right episode of the group gets; for accuracy it
   is 0 (min a = 0 whenever the term is not skipped). The explicit accuracy,
   latency and cost terms follow.
5. The release looks every feature it meets up in P (`cur_pref_vec[one_feature]`);
   a feature P does not name weighs 0 here.
6. The release first computes `efficiency_reward` (1 − 5·cost − latency/500,
   `data.efficiency_reward=true` in `training/train_orchestrator.sh`), then
   resets `rewards_by_rollout_id` and computes the above: the efficiency value
   never reaches training, so it has no counterpart here.

The advantage (`(R − mean) / (stdev + 1e-6)` clipped to ±3, `rl.adv_clip`), the
group filter (`stdev > 0.1`, `rl.filter_reward_std`), the no-answer filter
(`valid_answers`, `rl.drop_no_answer`) and the advantage boost (`rl.advantage_boost`)
are GRPO's, in rl/grpo.py; docs/reproduction.md lists them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from orchestra_jax.agent.trajectory import FIRST_CALL_PREFIX
from orchestra_jax.rewards.preference import TOOL_PREFIX, check_feature_name


def _value(features: Sequence[Mapping[str, float]], name: str) -> np.ndarray:
    try:
        return np.asarray([float(f[name]) for f in features], dtype=np.float64)
    except KeyError:
        raise ValueError(f"the reference reward needs a {name!r} feature per episode") from None


def _first_call_counts(features: Sequence[Mapping[str, float]]) -> dict[str, np.ndarray]:
    """n_i,f per tool feature f ("tool:<name>") that some episode's turn called first."""
    names = sorted(
        {
            key.removeprefix(FIRST_CALL_PREFIX)
            for f in features
            for key, count in f.items()
            if key.startswith(FIRST_CALL_PREFIX + TOOL_PREFIX) and count >= 1
        }
    )
    return {
        name: np.asarray([float(f.get(FIRST_CALL_PREFIX + name, 0.0)) for f in features])
        for name in names
    }


def _min_max_term(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """(values − lo) / (hi − lo), or 0 when hi == lo (the release skips the term)."""
    if hi <= lo:
        return np.zeros_like(values)
    return (values - lo) / (hi - lo)


def toolorchestra_reference_rewards(
    features: Sequence[Mapping[str, float]],
    correct: Sequence[bool],
    preference: Mapping[str, float],
) -> np.ndarray:
    """The release's reward over one group (see the module docstring for each term).

    Args:
      features: one mapping per episode (`Trajectory.features()`): "cost",
        "latency", and "first_call:tool:<name>" turn counts.
      correct: whether each episode's answer is right.
      preference: P, weights keyed by feature name.

    Returns:
      float32 rewards, one per episode; 0 for wrong episodes.
    """
    if len(features) != len(correct):
        raise ValueError(f"{len(features)} feature rows but {len(correct)} correctness flags")
    if not features:
        raise ValueError("a reward group needs at least one episode")
    for name in preference:
        check_feature_name(name)
    weight = {name: float(w) for name, w in preference.items()}
    right = np.asarray(correct, dtype=bool)
    rewards = np.zeros(len(features), dtype=np.float64)

    # Quirks 1 and 2: first-call counts, min/max over the episodes that used the tool.
    for name, counts in _first_call_counts(features).items():
        used = counts[counts >= 1]
        rewards += weight.get(name, 0.0) * _min_max_term(counts, used.min(), used.max())

    accuracy = right.astype(np.float64)
    rewards += weight.get("accuracy", 0.0) * _min_max_term(accuracy, accuracy.min(), accuracy.max())
    for name in ("cost", "latency"):
        raw = _value(features, name)
        lo, hi = (-raw).min(), (-raw).max()
        # Quirk 4: the feature loop's term, the rollout's count (0) min-maxed.
        rewards += weight.get(name, 0.0) * _min_max_term(np.zeros_like(raw), lo, hi)
        # Quirk 3: min/max of −x, numerator x.
        rewards += weight.get(name, 0.0) * _min_max_term(raw, lo, hi)
    return np.where(right, rewards, 0.0).astype(np.float32)
