"""How a run reaches its LLM: the ``llm`` section of a run's config.

Only the *name* of the environment variable holding the API key is part of the
config, so a dumped config (the run directory keeps one) never contains a secret.
Values left unset here come from the environment when the client starts:
``EVOKERNEL_LLM_BASE_URL``, ``EVOKERNEL_LLM_MODEL`` (comma-separated for several)
and ``EVOKERNEL_LLM_API_KEY`` or ``OPENAI_API_KEY``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ENV_BASE_URL = "EVOKERNEL_LLM_BASE_URL"
ENV_MODEL = "EVOKERNEL_LLM_MODEL"
ENV_KEYS = ("EVOKERNEL_LLM_API_KEY", "OPENAI_API_KEY")
NO_KEY = "not-needed"
"""Sent when no key is set: local servers ignore it, ``openai`` insists on one."""

Mode = Literal["live", "record", "replay"]
DiffMode = Literal["full", "diff", "both"]


class Price(BaseModel):
    """US dollars per million tokens, for the cost estimate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)


class LLMConfig(BaseModel):
    """The LLM client and the LLM operators of one run."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    mode: Mode = "record"
    """``live``: ask, keep nothing; ``record``: ask once, keep every reply in the run
    directory and answer repeats from it (resume); ``replay``: answer only from a
    recording, never contact an endpoint."""
    base_url: str | None = None
    model: str | None = None
    models: list[str] = Field(default_factory=list)
    """Several models: a UCB1 bandit over operator success picks one per request."""
    api_key_env: str | None = None
    """Name of the variable holding the key (default: EVOKERNEL_LLM_API_KEY, OPENAI_API_KEY)."""
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=4, ge=0)
    """Retries after a 429, a 5xx, a timeout, a dropped connection or a malformed reply."""
    backoff_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=30.0, ge=0)
    concurrency: int = Field(default=4, ge=1)
    token_budget: int | None = Field(default=None, ge=1)
    """Prompt plus completion tokens for the whole run; no new request once spent."""
    prices: dict[str, Price] = Field(default_factory=dict)
    """Model name -> price, for the cost estimate (unknown models cost nothing)."""
    temperature: float = Field(default=0.7, ge=0, le=2)
    max_tokens: int = Field(default=4096, ge=1)
    send_seed: bool = True
    """Send each request's seed (drawn from the run's RNG) to the endpoint."""
    diff_mode: DiffMode = "both"
    """Mutation replies as whole files, SEARCH/REPLACE diffs, or both operators."""
    preset: str = "default"
    """A preset of ``operators/presets.yaml``: which LLM operators, their weights and options."""
    operators: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per-operator overrides of the preset (``{agent: {max_turns: 4}}``)."""
    recording_dir: str | None = None
    """Where replies are read from and written to; default ``<run_dir>/llm``."""
    fallback_to_builtin: bool = True
    """With no endpoint configured, run with the built-in operators only (else stop)."""

    def resolved_models(self, environ: Mapping[str, str] | None = None) -> list[str]:
        env = os.environ if environ is None else environ
        if self.models:
            return list(self.models)
        if self.model:
            return [self.model]
        return [m.strip() for m in env.get(ENV_MODEL, "").split(",") if m.strip()]

    def resolved_base_url(self, environ: Mapping[str, str] | None = None) -> str | None:
        env = os.environ if environ is None else environ
        return self.base_url or env.get(ENV_BASE_URL) or None

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The key, read now from the environment; never stored on the config."""
        env = os.environ if environ is None else environ
        names = (self.api_key_env,) if self.api_key_env else ENV_KEYS
        for name in names:
            if env.get(name):
                return env[name]
        return None

    def resolved(self, environ: Mapping[str, str] | None = None) -> LLMConfig:
        """A copy with the endpoint and models the environment gives fixed in it (never the key),
        for the run directory's config: a resumed run then sends the very same requests."""
        return self.model_copy(update={
            "base_url": self.resolved_base_url(environ), "models": self.resolved_models(environ),
            "model": None,
        })

    def recordings(self, run_dir: str | Path | None) -> Path | None:
        if self.recording_dir is not None:
            return Path(self.recording_dir)
        return None if run_dir is None else Path(run_dir) / "llm"


HOW_TO_CONFIGURE = f"""\
No LLM endpoint is configured, so the LLM operators are off.
Point evokernel at any OpenAI-compatible server, either in the environment:
    export {ENV_BASE_URL}=http://127.0.0.1:8000/v1   # omit for api.openai.com
    export {ENV_MODEL}=<model name>                  # several: a,b,c
    export {ENV_KEYS[0]}=<key>                       # or {ENV_KEYS[1]}; local servers need none
or in the run config:
    llm: {{base_url: http://127.0.0.1:8000/v1, model: <name>, api_key_env: MY_KEY_VAR}}
or replay a recorded run without any endpoint:
    llm: {{mode: replay, recording_dir: <old run dir>/llm}}   (CLI: --llm replay)"""


def endpoint_problem(
    config: LLMConfig, environ: Mapping[str, str] | None = None
) -> str | None:
    """Why the LLM operators cannot run with this config, with how to fix it; None if they can."""
    if config.mode == "replay":
        return None  # needs no endpoint; a missing recording is reported per request
    models = config.resolved_models(environ)
    base_url = config.resolved_base_url(environ)
    if base_url is None and config.api_key(environ) is None:
        return HOW_TO_CONFIGURE
    if not models:
        return f"No LLM model is named: set {ENV_MODEL} or llm.model in the run config.\n" + HOW_TO_CONFIGURE
    return None
