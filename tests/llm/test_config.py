"""Config resolution and the message shown when no endpoint is configured."""

from __future__ import annotations

from evokernel.llm import HOW_TO_CONFIGURE, LLMConfig, endpoint_problem
from evokernel.llm.bandit import UCB1
from evokernel.operators.llm import llm_unavailable


def test_environment_fills_the_gaps() -> None:
    env = {"EVOKERNEL_LLM_BASE_URL": "http://h/v1", "EVOKERNEL_LLM_MODEL": "a, b", "OPENAI_API_KEY": "sk-zzz-secret"}
    config = LLMConfig()
    assert config.resolved_base_url(env) == "http://h/v1"
    assert config.resolved_models(env) == ["a", "b"]
    assert config.api_key(env) == "sk-zzz-secret"
    assert LLMConfig(model="m", base_url="http://x/v1").resolved_models(env) == ["m"]
    assert LLMConfig(api_key_env="MINE").api_key({"MINE": "z", "OPENAI_API_KEY": "k"}) == "z"
    assert endpoint_problem(config, env) is None
    fixed = config.resolved(env)
    assert (fixed.base_url, fixed.models) == ("http://h/v1", ["a", "b"]) and "sk-zzz-secret" not in fixed.model_dump_json()
    assert endpoint_problem(fixed, {"OPENAI_API_KEY": "k"}) is None


def test_no_endpoint_says_how_to_configure() -> None:
    message = endpoint_problem(LLMConfig(), {})
    assert message == HOW_TO_CONFIGURE
    assert "EVOKERNEL_LLM_BASE_URL" in message and "--llm replay" in message
    no_model = endpoint_problem(LLMConfig(base_url="http://h/v1"), {})
    assert no_model is not None and "EVOKERNEL_LLM_MODEL" in no_model
    assert endpoint_problem(LLMConfig(mode="replay"), {}) is None
    assert "built-in operators only" in (llm_unavailable(LLMConfig(), {}) or "")
    assert "Stopping" in (llm_unavailable(LLMConfig(fallback_to_builtin=False), {}) or "")
    assert llm_unavailable(LLMConfig(base_url="http://h/v1", model="m"), {}) is None


def test_ucb1_prefers_the_model_that_works() -> None:
    bandit = UCB1(["good", "bad"])
    for _ in range(40):
        arm = bandit.choose()
        bandit.update(arm, 1.0 if arm == "good" else 0.0)
    assert bandit.counts["good"] > 3 * bandit.counts["bad"]
    clone = UCB1(["good", "bad"])
    clone.load(bandit.state())
    assert clone.choose() == bandit.choose()
