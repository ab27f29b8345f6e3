"""The `rollout` section of an experiment config as `RolloutConfig`: the engine that
samples the policy's turns (`rollout/engine.ENGINES`), its sampling, and how the HTTP
clients treat their servers (`rollout.server_pool`, `ServerPoolConfig`), checked once
(`problems`). The rules that read the `agent` section too (its context against the
KV cache, its enum constraint against the engine) are in
training/experiment_config.py."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from orchestra_jax.config_section import Section, SectionError, plain, split_list
from orchestra_jax.rollout.engine import ENGINES, SamplingParams
from orchestra_jax.rollout.http.client import DEFAULT_API_KEY_ENV
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings, settings_problems


@dataclasses.dataclass(frozen=True)
class ServerPoolConfig(Section, ServerPoolSettings):
    """`rollout.server_pool.*`: the HTTP clients' `ServerPoolSettings`, its fields and
    defaults (rollout/http/server_pool_settings.py says what each does)."""

    SECTION = "rollout.server_pool"

    def problems(self) -> list[str]:
        return settings_problems(dataclasses.asdict(self), f"{self.SECTION}.")

    @classmethod
    def from_config(cls, values: Mapping[str, Any] | None) -> ServerPoolConfig:
        """As `Section.from_config`, a name that is no setting reported as the
        settings report it (with the known names), together with the values out of
        range."""
        given = plain(values) if values is not None else {}
        problems = settings_problems(given, f"{cls.SECTION}.")
        if problems:
            raise SectionError(problems)
        return super().from_config(given)

    def settings(self) -> ServerPoolSettings:
        return ServerPoolSettings(**dataclasses.asdict(self))


# The config field behind each engine argument that a config must set when the
# engine takes it (the others have working defaults).
ENGINE_FIELDS = {"urls": "rollout.urls", "weights_dir": "rollout.weights_dir"}


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Section):
    """`rollout.*`, named as in the config file (experiments/configs/grpo_hle.py says
    what each field does)."""

    SECTION = "rollout"
    NESTED = {"server_pool": ServerPoolConfig}

    engine: str = "jax"
    urls: str = ""
    weights_dir: str = ""
    api_key_env: str = DEFAULT_API_KEY_ENV
    sync_tolerance: float = 0.0
    max_batch_size: int = 64
    max_seq_len: int = 2048
    prefix_cache: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    infra_retries: int = 2
    server_pool: ServerPoolConfig = dataclasses.field(default_factory=ServerPoolConfig)

    def problems(self) -> list[str]:
        errors = self.choice("engine", ENGINES)
        if not errors:
            errors += self._engine_problems()
        errors += self.positive("max_batch_size", "max_seq_len")
        errors += self.positive("temperature", "sync_tolerance", "infra_retries", allow_zero=True)
        if not 0 < self.top_p <= 1:
            errors.append(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        return errors

    def _engine_problems(self) -> list[str]:
        """What the engine's constructor needs that this section does not give."""
        errors = []
        arguments = self.engine_arguments()
        for name, param in engine_parameters(self.engine).items():
            if name in ENGINE_FIELDS and not arguments[name]:
                errors.append(f"{ENGINE_FIELDS[name]}: the {self.engine!r} engine needs it")
            elif name not in arguments and param.default is inspect.Parameter.empty:
                if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                    errors.append(
                        f"rollout.engine={self.engine!r} cannot be built from a config "
                        f"(its constructor needs {name!r})"
                    )
        return errors

    def engine_arguments(
        self, model: Any = None, model_config: Any = None, max_context_tokens: int | None = None
    ) -> dict[str, Any]:
        """Everything a rollout engine may take from the config (`max_context_tokens`:
        `agent.max_context_tokens`); each engine takes the arguments its constructor
        names (`training/builders.build_engine`). The server pool's settings are None
        when a value is out of range (`problems` names it)."""
        pool = self.server_pool
        return dict(
            model=model,
            model_config=model_config,
            max_batch_size=self.max_batch_size,
            max_seq_len=self.max_seq_len,
            prefix_cache=self.prefix_cache,
            urls=split_list(self.urls),
            weights_dir=self.weights_dir,
            sync_tolerance=self.sync_tolerance or None,
            settings=None if pool.problems() else pool.settings(),
            api_key_env=self.api_key_env or None,
            max_context_tokens=max_context_tokens,
        )

    def sampling_params(self, max_new_tokens: int) -> SamplingParams:
        """Training rollouts' sampling, `max_new_tokens` a turn."""
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=max_new_tokens,
        )


def engine_parameters(engine: str) -> dict[str, inspect.Parameter]:
    """The constructor parameters of the engine `engine` names (`ENGINES`)."""
    return dict(inspect.signature(ENGINES.get(engine)).parameters)
