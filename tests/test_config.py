"""Config: the YAML defaults match the code, presets load, errors are one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from evokernel.config import ConfigError, RunConfig, build, dump, read_yaml

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_default_yaml_spells_out_the_code_defaults() -> None:
    assert RunConfig.model_validate(read_yaml(CONFIGS / "default.yaml")) == RunConfig()
    assert set(read_yaml(CONFIGS / "default.yaml")) == set(RunConfig.model_fields)


@pytest.mark.parametrize("preset", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_preset_loads(preset: str) -> None:
    config = build([(preset, read_yaml(CONFIGS / preset))])
    if preset != "default.yaml":
        assert config.strategy == preset.removesuffix(".yaml")


def test_auto_depends_on_the_machine() -> None:
    cpu, gpu = RunConfig().resolved(cuda=False), RunConfig().resolved(cuda=True)
    assert (cpu.budget.evaluations, cpu.shapes, cpu.batch_size) == (12, "smoke", 4)
    assert (gpu.budget.evaluations, gpu.shapes, gpu.batch_size) == (200, "quick", 8)
    fixed = build([("cli", {"budget": {"evaluations": 5}, "shapes": "all"})]).resolved(cuda=False)
    assert (fixed.budget.evaluations, fixed.shapes) == (5, "all")


def test_later_layers_win_and_nested_keys_merge() -> None:
    config = build([("a", {"population": {"islands": 4, "island_size": 8}}), ("b", {"population": {"islands": 3}})])
    assert (config.population.islands, config.population.island_size) == (3, 8)
    assert RunConfig.model_validate(dump(config)) == config


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"strategey": "random"}, "a: unknown key 'strategey'"),
        ({"evolutionary": {"crossover_p": 2}}, "a: evolutionary.crossover_p: Input should be less than or equal to 1"),
        ({"budget": {"evaluations": None}}, "set budget.evaluations or budget.gpu_seconds"),
        ({"runtime": {"kind": "slurm"}}, "a: runtime.kind"),
    ],
)
def test_errors_name_the_source_and_key(layer: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as info:
        build([("a", layer)])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unreadable_or_non_mapping_yaml(tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        read_yaml(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_yaml(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        read_yaml(tmp_path / "missing.yaml")
