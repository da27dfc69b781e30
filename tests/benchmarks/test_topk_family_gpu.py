"""topk_family_gpu's summary of a landscape: the best configuration of each band."""

from __future__ import annotations

from benchmarks.topk_family_gpu import best_in_bands


def test_each_band_gets_its_fastest_configuration_that_passed_every_shape() -> None:
    summaries = {
        "default": {"status": "PASSED", "per_band_us": {"PT": 6.8, "MS": 37.0}},
        "all:WARPS=16": {"status": "PASSED", "per_band_us": {"PT": 7.0, "MS": 19.6}},
        "sample:001": {"status": "PASSED", "per_band_us": {"PT": 2.7, "MS": None}},
        "sample:002": {"status": "INCORRECT", "per_band_us": {"PT": 1.0, "MS": 5.0}},
    }
    best = best_in_bands(summaries, ["PT", "MS", "LL"])
    assert best == {"best_in_band_PT": "sample:001", "best_in_band_PT_us": 2.7,
                    "best_in_band_MS": "all:WARPS=16", "best_in_band_MS_us": 19.6}
