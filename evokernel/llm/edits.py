"""Turning a model's reply into new source files: whole files or SEARCH/REPLACE edits.

Whole files come in fenced blocks labelled with the file name::

    ```python kernel.py
    <the complete file>
    ```

Edits name the file on the line before each block (a fence around them is optional)::

    kernel.py
    <<<<<<< SEARCH
    <lines copied exactly from the current file>
    =======
    <their replacement>
    >>>>>>> REPLACE

Both forms are accepted whatever the prompt asked for. Every failure is an
:class:`EditError` with a short ``reason`` code and a message fit for feedback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*(.*?)\s*$")
_SEARCH = re.compile(r"^\s*<{5,9}\s*SEARCH\s*$")
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_REPLACE = re.compile(r"^\s*>{5,9}\s*REPLACE\s*$")
_LANG_EXT = {
    "python": ".py", "py": ".py", "cuda": ".cu", "cu": ".cu", "c++": ".cu", "cpp": ".cu", "c": ".cu",
}


class EditError(ValueError):
    """A reply that yields no usable sources; ``reason`` is a stable code to count."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Block:
    label: str | None
    """The file name the block declares, if any."""
    lang: str | None
    text: str


@dataclass(frozen=True)
class Edit:
    path: str | None
    search: str
    replace: str


def _name_in(text: str, known: Sequence[str]) -> str | None:
    """A known file named by a fence info string or a label line (``**File: a.py**``)."""
    cleaned = re.sub(r"[`*#:=]|\bfile\b|\bFile\b|\bpath\b", " ", text)
    for token in cleaned.split():
        token = token.strip("'\".,()[]")
        if token in known:
            return token
        if any(PurePosixPath(k).name == token for k in known):
            return next(k for k in known if PurePosixPath(k).name == token)
    return None


def code_blocks(reply: str, known: Sequence[str]) -> list[Block]:
    """Every fenced block, with its file label; EditError if the last one never closes."""
    lines = reply.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group(1), m.group(2)
        label = _name_in(info, known)
        if label is None and i > 0 and lines[i - 1].strip():
            label = _name_in(lines[i - 1], known)
        lang = info.split()[0].lower() if info.split() else None
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = _FENCE.match(lines[j])
            if close and close.group(1)[0] == fence[0] and len(close.group(1)) >= len(fence) and not close.group(2):
                break
            body.append(lines[j])
            j += 1
        else:
            raise EditError("truncated", "a code block is never closed: the reply was cut off")
        blocks.append(Block(label, lang, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def parse_edits(reply: str, known: Sequence[str]) -> list[Edit]:
    """Every SEARCH/REPLACE block in order; EditError for a block left open."""
    lines = reply.splitlines()
    edits: list[Edit] = []
    i = 0
    while i < len(lines):
        if not _SEARCH.match(lines[i]):
            i += 1
            continue
        path = None
        for back in range(i - 1, max(-1, i - 3), -1):
            if lines[back].strip():
                path = _name_in(lines[back], known)
                if path is not None or not _FENCE.match(lines[back]):
                    break
        search: list[str] = []
        j = i + 1
        while j < len(lines) and not _DIVIDER.match(lines[j]):
            search.append(lines[j])
            j += 1
        replace: list[str] = []
        k = j + 1
        while k < len(lines) and not _REPLACE.match(lines[k]):
            replace.append(lines[k])
            k += 1
        if j >= len(lines) or k >= len(lines):
            raise EditError("truncated", "a SEARCH/REPLACE block is never closed: the reply was cut off")
        edits.append(Edit(path, "\n".join(search), "\n".join(replace)))
        i = k + 1
    return edits


def _locate(text: str, search: str) -> tuple[int, int] | int | None:
    """(start, end) of the one match; None if absent; the count if it is ambiguous.

    Exact text first, then line by line ignoring trailing whitespace.
    """
    count = text.count(search)
    if count == 1:
        start = text.index(search)
        return start, start + len(search)
    if count > 1:
        return count
    want = [line.rstrip() for line in search.splitlines()]
    have = text.splitlines(keepends=True)
    hits = [
        i for i in range(len(have) - len(want) + 1)
        if [line.rstrip() for line in have[i : i + len(want)]] == want
    ]
    if len(hits) > 1:
        return len(hits)
    if not hits:
        return None
    start = sum(len(line) for line in have[: hits[0]])
    end = start + sum(len(line) for line in have[hits[0] : hits[0] + len(want)])
    if have[hits[0] + len(want) - 1].endswith("\n"):
        end -= 1  # keep the newline after the matched block
    return start, end


def apply_edits(sources: Mapping[str, str], edits: Sequence[Edit]) -> dict[str, str]:
    """The sources with every edit applied in order, or EditError naming the first that fails."""
    out = dict(sources)
    for n, edit in enumerate(edits, 1):
        if not edit.search.strip():
            raise EditError("diff_not_applied", f"edit {n}: the SEARCH part is empty")
        targets = [edit.path] if edit.path in out else list(out)
        found = [(p, loc) for p in targets if isinstance(loc := _locate(out[p], edit.search), tuple)]
        if len(found) != 1:
            ambiguous = [p for p in targets if isinstance(_locate(out[p], edit.search), int)]
            where = edit.path or "any file"
            if ambiguous or len(found) > 1:
                raise EditError(
                    "diff_not_applied",
                    f"edit {n}: the SEARCH text matches more than once in {where}; include more lines",
                )
            first = edit.search.strip().splitlines()[0][:80]
            raise EditError(
                "diff_not_applied",
                f"edit {n}: the SEARCH text starting {first!r} is not in {where}; copy it exactly",
            )
        path, (start, end) = found[0]
        out[path] = out[path][:start] + edit.replace + out[path][end:]
    return out


def _file_for(block: Block, sources: Mapping[str, str]) -> str | None:
    """The file a block replaces: its label, else the one file of its language."""
    if block.label is not None:
        return block.label
    if block.lang is None:
        return next(iter(sources)) if len(sources) == 1 else None
    ext = _LANG_EXT.get(block.lang)  # ```bash, ```text, ```json ... replace nothing
    matches = [p for p in sources if ext and p.endswith(ext)]
    return matches[0] if len(matches) == 1 else None


def apply_reply(reply: str, sources: Mapping[str, str], entry_point: str) -> dict[str, str]:
    """New sources from a reply: its edits if it has any, else its whole files.

    EditError when nothing maps onto a file (``no_code``), an edit does not apply
    (``diff_not_applied``), the reply was cut off (``truncated``) or the entry file
    lost its factory (``invalid_code``).
    """
    known = list(sources)
    edits = parse_edits(reply, known)
    if edits:
        out = apply_edits(sources, edits)
    else:
        blocks = code_blocks(reply, known)
        chosen: dict[str, Block] = {}
        for block in blocks:
            path = _file_for(block, sources)
            if path is None or not block.text.strip():
                continue
            current = chosen.get(path)
            # a labelled block beats an unlabelled one; among equals the longest wins
            rank = (block.label is not None, len(block.text))
            if current is None or rank > (current.label is not None, len(current.text)):
                chosen[path] = block
        if not chosen:
            what = f"{len(blocks)} code block(s), none naming one of {known}" if blocks else "no code block"
            raise EditError("no_code", f"the reply has {what}")
        out = {**sources, **{p: b.text for p, b in chosen.items()}}
    file, _, symbol = entry_point.partition("::")
    if not re.search(rf"^\s*def\s+{re.escape(symbol)}\s*\(", out[file], re.MULTILINE):
        raise EditError("invalid_code", f"{file} no longer defines {symbol}(params, kernels)")
    return out
