"""Parsing replies into sources: labelled whole files, SEARCH/REPLACE edits, failures."""

from __future__ import annotations

import pytest

from evokernel.llm.edits import EditError, apply_reply

KERNEL = "import torch\n\n\ndef build(params, kernels):\n    def run(x, out):\n        out.copy_(x * 2)\n    return run\n"
ONE = {"kernel.py": KERNEL}
ENTRY = "kernel.py::build"
NEW = KERNEL.replace("x * 2", "x + x")


def test_labelled_whole_file() -> None:
    reply = f"Plan: add instead.\n\n```python kernel.py\n{NEW}```\n"
    assert apply_reply(reply, ONE, ENTRY) == {"kernel.py": NEW}


def test_label_on_the_line_before_and_unlabelled_single_file() -> None:
    assert apply_reply(f"**File: kernel.py**\n```python\n{NEW}```", ONE, ENTRY)["kernel.py"] == NEW
    assert apply_reply(f"```python\n{NEW}```", ONE, ENTRY)["kernel.py"] == NEW


def test_several_files_by_label_or_language() -> None:
    sources = {"host.py": KERNEL, "k.cu": "__global__ void k() {}\n"}
    reply = f"```cuda\nextern \"C\" __global__ void k() {{ }}\n```\n```python host.py\n{NEW}```"
    out = apply_reply(reply, sources, "host.py::build")
    assert out["host.py"] == NEW and out["k.cu"].startswith('extern "C"')


def test_search_replace_edits() -> None:
    reply = (
        "kernel.py\n```\n<<<<<<< SEARCH\n        out.copy_(x * 2)\n=======\n        out.copy_(x + x)\n"
        ">>>>>>> REPLACE\n```\n"
    )
    assert apply_reply(reply, ONE, ENTRY) == {"kernel.py": NEW}


def test_edit_tolerates_trailing_whitespace_and_finds_the_file() -> None:
    sources = {"host.py": KERNEL, "other.py": "x = 1\n"}
    reply = "<<<<<<< SEARCH\n        out.copy_(x * 2)   \n=======\n        out.copy_(x + x)\n>>>>>>> REPLACE"
    assert apply_reply(reply, sources, "host.py::build")["host.py"] == NEW


@pytest.mark.parametrize(
    ("reply", "reason", "words"),
    [
        ("I think the kernel is fine as it is.", "no_code", "no code block"),
        ("```text other.txt\nhello\n```", "no_code", "none naming"),
        (f"```python kernel.py\n{NEW}", "truncated", "cut off"),
        ("kernel.py\n<<<<<<< SEARCH\nnot in the file\n=======\nx\n>>>>>>> REPLACE", "diff_not_applied", "not in kernel.py"),
        ("<<<<<<< SEARCH\n\n=======\nx\n>>>>>>> REPLACE", "diff_not_applied", "empty"),
        ("kernel.py\n<<<<<<< SEARCH\n    return run\n=======\n", "truncated", "never closed"),
        ("```python kernel.py\ndef other(params, kernels):\n    pass\n```", "invalid_code", "no longer defines build"),
    ],
    ids=["prose", "unknown-file", "open-fence", "search-missing", "search-empty", "open-edit", "lost-entry"],
)
def test_failures_have_reasons(reply: str, reason: str, words: str) -> None:
    with pytest.raises(EditError, match=words) as info:
        apply_reply(reply, ONE, ENTRY)
    assert info.value.reason == reason


def test_ambiguous_search_fails() -> None:
    sources = {"kernel.py": KERNEL + "\n# run\n# run\n"}
    reply = "<<<<<<< SEARCH\n# run\n=======\n# done\n>>>>>>> REPLACE"
    with pytest.raises(EditError, match="more than once"):
        apply_reply(reply, sources, ENTRY)
