"""One τ² episode through the project's agent loop, against tau2-bench's own orchestrator.

ours: `run_graded_episodes` on the "tau2" environment: tau2's environment for
      the task (reset), the conversation in the agent loop (the policy a
      `ScriptedEngine` replaying the task's gold actions, then the fact to
      communicate; the user a `ScriptedUser`), tau2's evaluator on the record.
peer: tau2's own half-duplex `Orchestrator` playing the same conversation
      (a replaying agent and user written here against tau2's participant
      interfaces), then the same `evaluate_simulation`.
Both timed alternately after a warm-up, medians; the episode's parts (reset,
conversation, grading) are timed on their own for ours. Retail task 70 (one
write) and the mock domain's `create_task_1`.

  TAU2_DATA_DIR=../shared/tau2-bench/data python -m experiments.benchmarks.tau2_episode
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from experiments.benchmarks import common
from orchestra_jax.agent.loop import LoopLimits
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.data.tau2_tasks import read_tau2_tasks
from orchestra_jax.envs.tau2.env import Tau2Environment
from orchestra_jax.envs.tau2.user import ScriptedUser
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.training.rollouts import Episodes, run_graded_episodes

TASKS = {"retail": "70", "mock": "create_task_1"}
USER_LINES = ["I need help with my request."]


def gold_turns(task) -> list[str]:
    criteria = task.metadata["tau2_task"]["evaluation_criteria"]
    calls = [
        "<tool_call>\n"
        + json.dumps({"name": a["name"], "arguments": a["arguments"]})
        + "\n</tool_call>"
        for a in criteria["actions"]
    ]
    return calls + ["Done: " + " ".join(criteria.get("communicate_info") or ["all set"]) + "."]


def ours(env, task, tokenizer):
    turns = gold_turns(task)

    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        return tokenizer.encode(turns[min(turn, len(turns) - 1)]) + [tokenizer.im_end_id]

    how = Episodes(
        env=env,
        engine=ScriptedEngine(policy),
        tokenizer=tokenizer,
        sampling=SamplingParams(),
        limits=LoopLimits(max_turns=20, max_context_tokens=65536, enable_thinking=False),
    )
    config = env.tool_config_sampler().sample(task)

    def run():
        [traj] = asyncio.run(run_graded_episodes([task], [config], how, seed=0))
        assert traj.correct, traj.metadata.get("grade")

    return run


def peer(env, task):
    """tau2's orchestrator with a replaying agent and user, then its evaluator."""
    from tau2.agent.base_agent import HalfDuplexAgent
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.registry import registry
    from tau2.user.user_simulator_base import HalfDuplexUser, UserState

    tau2_task = env.tau2_task(task)
    criteria = tau2_task.evaluation_criteria
    domain = task.metadata["tau2_domain"]

    class Replay(HalfDuplexAgent):
        def __init__(self):
            super().__init__(tools=[], domain_policy="")
            self.step = 0

        def get_init_state(self, message_history=None):
            return None

        def generate_next_message(self, message, state):
            self.step += 1
            if self.step <= len(criteria.actions or []):
                action = criteria.actions[self.step - 1]
                call = ToolCall(id=f"c{self.step}", name=action.name, arguments=action.arguments)
                return AssistantMessage(role="assistant", tool_calls=[call], cost=0.0), state
            info = " ".join(criteria.communicate_info or ["all set"])
            return AssistantMessage(role="assistant", content=f"Done: {info}.", cost=0.0), state

        def set_seed(self, seed):
            pass

    class Lines(HalfDuplexUser):
        def __init__(self):
            super().__init__(instructions="")
            self.said = 0

        def get_init_state(self, message_history=None):
            return UserState(system_messages=[], messages=[])

        def generate_next_message(self, message, state):
            self.said += 1
            text = USER_LINES[self.said - 1] if self.said <= len(USER_LINES) else "###STOP###"
            return UserMessage(role="user", content=text, cost=0.0), state

        def set_seed(self, seed):
            pass

        @classmethod
        def is_stop(cls, message):
            return "###STOP###" in (message.content or "")

    def run():
        orchestrator = Orchestrator(
            domain=domain,
            agent=Replay(),
            user=Lines(),
            environment=registry.get_env_constructor(domain)(),
            task=tau2_task,
            max_steps=env.max_steps,
        )
        simulation = orchestrator.run()
        reward = evaluate_simulation(
            simulation, tau2_task, EvaluationType.ALL, solo_mode=False, domain=domain
        )
        assert reward.reward == 1.0, reward

    return run


def parts(env, task, tokenizer, repeats):
    """Median seconds of our episode's parts: reset, conversation, grading."""
    reset, grade = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        state = env.reset(task)
        reset.append(time.perf_counter() - start)
        state.termination = "user_stop"
        start = time.perf_counter()
        asyncio.run(env.grade(task, None, state=state))
        grade.append(time.perf_counter() - start)
    return {
        "reset_s": common.summarize({"x": reset})["x"],
        "grade_s": common.summarize({"x": grade})["x"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    data_dir = os.environ.get("TAU2_DATA_DIR", "../shared/tau2-bench/data")
    tokenizer = load_tokenizer("demo")
    env = Tau2Environment(lambda t, e: ScriptedUser(USER_LINES), data_dir=data_dir)
    results = {}
    for domain, task_id in TASKS.items():
        tasks, _ = read_tau2_tasks(os.path.join(data_dir, "tau2", "domains", domain))
        [task] = [t for t in tasks if t.id == f"tau2/{domain}/{task_id}"]
        task.metadata["tau2_task"]["evaluation_criteria"]["reward_basis"] = ["DB", "COMMUNICATE"]
        timings = common.alternate_timings(
            {"ours": ours(env, task, tokenizer), "peer": peer(env, task)}, args.repeats
        )
        summary = common.summarize(timings)
        results[domain] = {
            "task": task.id,
            **summary,
            "ratio": summary["ours"]["median_s"] / summary["peer"]["median_s"],
            "ours_parts": parts(env, task, tokenizer, args.repeats),
        }
        print(domain, json.dumps(results[domain], indent=1))
    path = common.write_result("tau2_episode", {"repeats": args.repeats, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
