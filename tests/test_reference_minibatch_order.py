"""Mini-batches as the release's make them: `_balance_batch` (training/verl/trainer/
ppo/ray_trainer.py 906-917, `get_seqlen_balanced_partitions` from
verl/utils/seqlen_balancing.py, ported verbatim below with lists for tensors), then
verl's split of the batch over 16 GPUs, Ulysses pairs gathering theirs, and each
data-parallel group's mini-batches of 16 / 8 in order (`dp_actor.update_policy`).
`qwen3_8b`'s `rl.balance_partitions` must give every update the same samples."""

import heapq
import types

import numpy as np
import pytest

from experiments.configs import grpo_hle
from orchestra_jax.rl.batching import BatchingConfig
from orchestra_jax.rl.config import RLConfig
from orchestra_jax.rl.minibatch_order import release_order, reorder_samples
from orchestra_jax.rl.samples import Sample
from orchestra_jax.training import experiment_config, loop_steps
from orchestra_jax.training.rollouts import StepExperience
from tests.trajectory_helpers import graded_episode


def karmarkar_karp(seqlen_list, k_partitions, equal_size):
    class Set:
        def __init__(self) -> None:
            self.sum = 0
            self.items = []

        def add(self, idx: int, val: int):
            self.items.append((idx, val))
            self.sum += val

        def merge(self, other):
            for idx, val in other.items:
                self.items.append((idx, val))
                self.sum += val

        def __lt__(self, other):
            if self.sum != other.sum:
                return self.sum < other.sum
            if len(self.items) != len(other.items):
                return len(self.items) < len(other.items)
            return self.items < other.items

    class State:
        def __init__(self, items, k: int) -> None:
            self.k = k
            self.sets = [Set() for _ in range(k)]
            assert len(items) in [1, k], f"{len(items)} not in [1, {k}]"
            for i, (idx, seqlen) in enumerate(items):
                self.sets[i].add(idx=idx, val=seqlen)
            self.sets = sorted(self.sets, reverse=True)

        def get_partitions(self):
            partitions = []
            for i in range(len(self.sets)):
                cur_partition = []
                for idx, _ in self.sets[i].items:
                    cur_partition.append(idx)
                partitions.append(cur_partition)
            return partitions

        def merge(self, other):
            for i in range(self.k):
                self.sets[i].merge(other.sets[self.k - 1 - i])
            self.sets = sorted(self.sets, reverse=True)

        @property
        def spread(self) -> int:
            return self.sets[0].sum - self.sets[-1].sum

        def __lt__(self, other):
            if self.spread != other.spread:
                return self.spread > other.spread
            return self.sets[0] > other.sets[0]

    sorted_seqlen_list = sorted([(seqlen, i) for i, seqlen in enumerate(seqlen_list)])
    states_pq = []
    if equal_size:
        assert len(seqlen_list) % k_partitions == 0, f"{len(seqlen_list)} % {k_partitions} != 0"
        for offset in range(0, len(sorted_seqlen_list), k_partitions):
            items = []
            for i in range(k_partitions):
                seqlen, idx = sorted_seqlen_list[offset + i]
                items.append((idx, seqlen))
            heapq.heappush(states_pq, State(items=items, k=k_partitions))
    else:
        for seqlen, idx in sorted_seqlen_list:
            heapq.heappush(states_pq, State(items=[(idx, seqlen)], k=k_partitions))
    while len(states_pq) > 1:
        state0 = heapq.heappop(states_pq)
        state1 = heapq.heappop(states_pq)
        state0.merge(state1)
        heapq.heappush(states_pq, state0)
    final_state = states_pq[0]
    partitions = final_state.get_partitions()
    return partitions


def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
    assert len(seqlen_list) >= k_partitions

    def _check_and_sort_partitions(partitions):
        assert len(partitions) == k_partitions, f"{len(partitions)} != {k_partitions}"
        seen_idx = set()
        sorted_partitions = [None] * k_partitions
        for i, partition in enumerate(partitions):
            assert len(partition) > 0, f"the {i}-th partition is empty"
            for idx in partition:
                seen_idx.add(idx)
            sorted_partitions[i] = sorted(partition)
        assert seen_idx == set(range(len(seqlen_list)))
        return sorted_partitions

    partitions = karmarkar_karp(
        seqlen_list=seqlen_list, k_partitions=k_partitions, equal_size=equal_size
    )
    return _check_and_sort_partitions(partitions)


def release_updates(lengths, world_size=16, sp=2, ppo_mini_batch_size=16):
    """The samples (indices) of each of the release's updates."""
    # _balance_batch: reorder by the partitions, concatenated.
    global_seqlen_lst = list(lengths)
    global_partition_lst = get_seqlen_balanced_partitions(
        global_seqlen_lst, k_partitions=world_size, equal_size=True
    )
    global_idx = [j for partition in global_partition_lst for j in partition]
    # DP_COMPUTE_PROTO: chunk r to GPU r; a Ulysses group gathers its GPUs' chunks.
    chunk = len(global_idx) // world_size
    per_gpu = [global_idx[r * chunk : (r + 1) * chunk] for r in range(world_size)]
    groups = [sum(per_gpu[g * sp : (g + 1) * sp], []) for g in range(world_size // sp)]
    # fsdp_workers: ppo_mini_batch_size //= world_size // sp; update_policy splits in order.
    local = ppo_mini_batch_size // (world_size // sp)
    n_updates = len(groups[0]) // local
    return [
        sorted(i for g in groups for i in g[j * local : (j + 1) * local]) for j in range(n_updates)
    ]


LENGTHS = [  # 64 turn samples' token counts: prompts of 300-24000 tokens and their turns
    (7919 * i) % 23700 + 300 + (i % 7) * 131 for i in range(64)
]


@pytest.mark.parametrize("n", [16, 48, 64])
def test_qwen3_8b_trains_the_releases_minibatches(n):
    rl = grpo_hle.get_config("qwen3_8b").rl
    order = release_order(LENGTHS[:n], rl.balance_partitions, rl.balance_group_size, 16)
    ours = [sorted(order[k : k + 16]) for k in range(0, n, 16)]
    assert ours == release_updates(LENGTHS[:n])


def test_samples_are_reordered_by_their_tokens_and_the_remainder_keeps_its_place():
    samples = [Sample([1] * n, [1] * n, [0.0] * n, 1.0) for n in LENGTHS[:37]]
    reordered = reorder_samples(samples, 16, 2, 16)
    assert sorted(map(id, reordered)) == sorted(map(id, samples))
    assert reordered[32:] == samples[32:]  # 37 mod 16: the last five, in order
    assert [len(s.token_ids) for s in reordered[:32]] != LENGTHS[:32]
    project = grpo_hle.get_config("qwen3_8b_project").rl
    assert reorder_samples(samples, project.balance_partitions, 2, 16) == samples


def test_partitions_that_do_not_split_a_minibatch_are_a_config_error():
    config = grpo_hle.get_config("qwen3_8b")
    config.rl.balance_partitions = 12
    assert any("rl.balance_partitions" in e for e in experiment_config.problems(config))


class RecordingLearner:
    """The learner's mini-batch arithmetic (m = 16) and a `train_step` that keeps the
    batch it was given."""

    def __init__(self, size=16):
        self.size, self.batches = size, []

    def minibatch_sizes(self, n):
        return [self.size] * (n // self.size) + ([n % self.size] if n % self.size else [])

    def minibatch_rows(self, n):
        return min(self.size, n)

    def train_step(self, batch, *, num_minibatches, minibatch_sizes):
        self.batches.append(batch)
        return {"updates": float(num_minibatches)}


def test_the_learner_trains_the_samples_in_the_release_order():
    """`loop_steps.train_step` hands the learner its mini-batches in `release_order`."""
    config = grpo_hle.get_config("qwen3_8b")
    config.rl.sample_unit = "episode"  # one sample an episode: its first token names it
    config.rl.pack = False  # one sample a row, to read the order (packing: test_rl_packing)
    config.rl.share_prefixes = False
    lengths = [3 + (7 * i) % 23 for i in range(32)]
    episodes = [
        graded_episode(
            f"t{i}",
            token_ids=[100 + i] + [5] * (n - 1),
            loss_mask=[0] + [1] * (n - 1),
            rollout_logprobs=[0.0] * n,
            advantage=1.0,
        )
        for i, n in enumerate(lengths)
    ]
    experience = StepExperience(
        trajectories=episodes,
        rewards=np.ones(32),
        advantages=np.ones(32),
        keep=np.ones(32, bool),
        metrics={},
    )
    learner = RecordingLearner(config.rl.minibatch_size)
    batching = BatchingConfig(seq_buckets=(32,))
    sections = types.SimpleNamespace(rl=RLConfig.from_config(config.rl))  # what train_step reads
    run = types.SimpleNamespace(sections=sections, learner=learner, batching=batching)
    loop_steps.train_step(run, experience)
    [batch] = learner.batches
    first = np.asarray(batch.input_ids)[:, 0] - 100
    n = len(learner.minibatch_sizes(32))  # mini-batch j: rows j, n + j, … (strided)
    trained = [int(i) for j in range(n) for i in first[j::n]]
    want = release_order(lengths, config.rl.balance_partitions, config.rl.balance_group_size, 16)
    assert trained == list(want) and trained != list(range(32))
