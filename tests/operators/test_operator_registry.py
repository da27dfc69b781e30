"""An operator registered from outside evokernel gets children by its rate, and only then."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from evokernel import search
from evokernel.candidate import Candidate
from evokernel.operators import OPERATORS, OperatorContext

FAKE = str(Path(__file__).resolve().parents[1] / "fake_run.yaml")


class TileReset:
    """Puts TILE back to its declared default (nothing to do if it is there already)."""

    name = "tile_reset"
    arity = 1

    def propose(self, parents: Sequence[Candidate], ctx: OperatorContext) -> list[Candidate]:
        (parent,) = parents
        space = parent.knob_space.get("TILE")
        if space is None or parent.params.get("TILE") == space.initial:
            return []
        return [parent.with_params(knobs={"TILE": space.initial}, operator=self.name, generation=ctx.generation)]


@pytest.fixture
def registered() -> Iterator[None]:
    OPERATORS.register("tile_reset", TileReset)
    yield
    OPERATORS.unregister("tile_reset")


def operators_used(run: Path) -> Counter[str]:
    return Counter(json.loads(x)["candidate"]["operator"] for x in (run / "journal.jsonl").read_text().splitlines())


@pytest.mark.parametrize("strategy", ["evolutionary", "greedy"])
def test_a_registered_operator_is_drawn_by_its_rate(registered: None, tmp_path: Path, strategy: str) -> None:
    common = ["--config", FAKE, "--strategy", strategy, "--budget", "40", "--quiet"]
    assert search.main([*common, "--run-dir", str(tmp_path / "on"), "--set", "operators.rates.tile_reset=1"]) == 0
    assert search.main([*common, "--run-dir", str(tmp_path / "off")]) == 0
    assert operators_used(tmp_path / "on")["tile_reset"] > 0
    assert operators_used(tmp_path / "off")["tile_reset"] == 0


def test_rates_of_an_unregistered_operator_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert search.main(["--config", FAKE, "--run-dir", str(tmp_path / "r"), "--set", "operators.rates.tile_rest=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown operator 'tile_rest'" in err and "knob_mutation" in err and "\n" not in err
    assert search.main(["--config", FAKE, "--run-dir", str(tmp_path / "r"), "--strategy", "random",
                        "--set", "operators.rates.knob_mutation=1"]) == 2
    assert "needs strategy evolutionary, greedy or map_elites, not 'random'" in capsys.readouterr().err
