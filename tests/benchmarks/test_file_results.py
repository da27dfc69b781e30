"""Filing a device call's archive: names tagged, references renamed, nothing overwritten."""

from __future__ import annotations

import io
import json
import lzma
import tarfile
from pathlib import Path

import pytest

from benchmarks import file_results


def _archive(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_an_archive_is_filed_under_its_tag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    monkeypatch.setattr(file_results, "RESULTS", results)
    result = {"command": "python x.py", "raw": "throughput-dsa_topk-h100-80gb-hbm3-2026-12-05.csv",
              "metrics": {"evaluator": {"landscape": "landscape-dsa_topk-cuda_radix-judge.jsonl"}}}
    archive = _archive(tmp_path / "throughput-214443.tgz", {
        "throughput-dsa_topk-h100-80gb-hbm3-2026-12-05.json": json.dumps(result),
        "throughput-dsa_topk-h100-80gb-hbm3-2026-12-05.csv": "a,b\n1,2\n",
        "landscape-dsa_topk-cuda_radix-judge.jsonl": '{"x": 1}\n',
        "throughput.log": "log\n",
        "gpu-mem-throughput.log": "ignored\n",
    })
    filed = file_results.file_archive(archive, "fast")
    names = sorted(p.relative_to(results).as_posix() for p in filed)
    assert names == ["logs/throughput-fast-h100-2026-12-05.log",
                     "raw/landscape-dsa_topk-cuda_radix-judge-fast-h100-2026-12-05.jsonl.xz",
                     "throughput-dsa_topk-fast-h100-2026-12-05.csv",
                     "throughput-dsa_topk-fast-h100-2026-12-05.json"]
    written = json.loads((results / "throughput-dsa_topk-fast-h100-2026-12-05.json").read_text())
    assert written["raw"] == "throughput-dsa_topk-fast-h100-2026-12-05.csv"
    assert written["metrics"]["evaluator"]["landscape"] == \
        "raw/landscape-dsa_topk-cuda_radix-judge-fast-h100-2026-12-05.jsonl.xz"
    assert written["command"] == "python x.py"
    landscape = results / "raw/landscape-dsa_topk-cuda_radix-judge-fast-h100-2026-12-05.jsonl.xz"
    assert lzma.decompress(landscape.read_bytes()) == b'{"x": 1}\n'
    with pytest.raises(SystemExit, match="already there"):
        file_results.file_archive(archive, "fast")


def test_a_stage_named_with_a_hyphen_keeps_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_run.sh's ``attn-check`` stage packs ``attn-check-<time>.tgz`` with
    ``attn-check.log``: the log is filed too."""
    results = tmp_path / "results"
    monkeypatch.setattr(file_results, "RESULTS", results)
    archive = _archive(tmp_path / "attn-check-030039.tgz", {
        "attn-gpu-check-h100-80gb-hbm3-2026-12-07.json": json.dumps({"metrics": {}}),
        "attn-check.log": "log\n",
    })
    names = sorted(p.relative_to(results).as_posix() for p in file_results.file_archive(archive, "t"))
    assert names == ["attn-gpu-check-t-h100-2026-12-07.json", "logs/attn-check-t-h100-2026-12-07.log"]


def test_a_profile_named_like_its_result_is_stamped_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bank-profile packs ``<what>-<device>-<date>.txt`` beside its JSON: the profile
    takes the result's filed name, not the device and date twice."""
    results = tmp_path / "results"
    monkeypatch.setattr(file_results, "RESULTS", results)
    archive = _archive(tmp_path / "bank-profile-215244.tgz", {
        "bank-profile-x-h100-80gb-hbm3-2026-12-07.json": json.dumps({"metrics": {}}),
        "bank-profile-x-h100-80gb-hbm3-2026-12-07.txt": "profile\n",
        "bank-profile.log": "log\n",
    })
    names = sorted(p.relative_to(results).as_posix() for p in file_results.file_archive(archive, "t"))
    assert names == ["bank-profile-x-t-h100-2026-12-07.json", "bank-profile-x-t-h100-2026-12-07.txt",
                     "logs/bank-profile-t-h100-2026-12-07.log"]


def test_a_search_cut_short_keeps_its_record_summary_and_best(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search stage ended by its time limit before its side by side still returns its
    early record (the finalists), the run's summary and the best candidate: the record and
    summary are filed under the tag, the candidate under benchmarks/candidates/."""
    results, candidates = tmp_path / "results", tmp_path / "candidates"
    monkeypatch.setattr(file_results, "RESULTS", results)
    monkeypatch.setattr(file_results, "CANDIDATES", candidates)
    archive = _archive(tmp_path / "search-055213.tgz", {
        "search-dsa_sparse_attention-h200-2026-12-07.json": json.dumps({"metrics": {"search": {"complete": False}}}),
        "search-dsa_sparse_attention-summary.md": "# run\n",
        "best_candidate.json": json.dumps({"name": "triton_split"}),
        "search.log": "log\n",
        "gpu-mem-search.log": "ignored\n",
    })
    filed = file_results.file_archive(archive, "attn")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in filed) == [
        "candidates/best_candidate-dsa_sparse_attention-attn-h200-2026-12-07.json", "results/logs/search-attn-h200-2026-12-07.log",
        "results/search-dsa_sparse_attention-attn-h200-2026-12-07.json",
        "results/search-dsa_sparse_attention-summary-attn-h200-2026-12-07.md"]
    assert json.loads((candidates / "best_candidate-dsa_sparse_attention-attn-h200-2026-12-07.json").read_text()) == {"name": "triton_split"}
