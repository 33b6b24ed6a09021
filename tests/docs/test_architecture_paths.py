"""docs/architecture.md names real files: every path it puts in backticks, every folder and file of its
code-layout tree, and every page it links to exist in the repository.

A path with a folder (``engine/graphs/runners/``) is taken from the repository's root; a bare or partial
one (``cleanup.py``, ``runners/kernel_gate.py``) is read, as a reader would, inside a folder that the same
paragraph names. Placeholders (``models/families/<name>.py``) and commands (``graphtop --prompts``) are
not paths. A page that names a file that was moved or never existed fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.paths import REPO

PAGE = REPO / "docs" / "architecture.md"
SUFFIXES = (".py", ".md", ".toml", ".sh", ".tcss", ".json", ".jsonl")
TICKED = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def is_path(text: str) -> bool:
    """A backticked span that names a file or folder (not code, a command or a placeholder)."""
    if any(c in text for c in " <>()*=,:") or text.startswith(("-", ".")):
        return False
    return text.endswith("/") or text.endswith(SUFFIXES)


def paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def resolves(path: str, folders: list[Path]) -> bool:
    if (REPO / path).exists():
        return True
    return any((folder / path).exists() for folder in folders)


def named_paths() -> list[tuple[str, list[Path]]]:
    """Each backticked path with the folders its paragraph names (where a partial path is read)."""
    found = []
    for para in paragraphs(PAGE.read_text(encoding="utf-8")):
        paths = [t for t in TICKED.findall(para) if is_path(t)]
        folders: list[Path] = []
        for p in paths:
            full = REPO / p
            if full.is_dir():
                folders.append(full)
            elif full.exists():
                folders.append(full.parent)
        found += [(p, folders) for p in paths]
    return found


def test_the_page_names_paths() -> None:
    """The parser finds what the page names (a parser that found nothing would pass any page)."""
    names = {p for p, _ in named_paths()}
    assert {"engine/engine.py", "engine/graphs/", "models/decoder.py", "pyproject.toml"} <= names


@pytest.mark.parametrize("path, folders", named_paths(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_backticked_path_exists(path: str, folders: list[Path]) -> None:
    assert resolves(path, folders), f"docs/architecture.md names `{path}`, which does not exist"


def layout_entries() -> list[str]:
    """The folders and files of the "Code layout" tree: ``engine/`` at the margin, ``graphs/`` under it
    two spaces in, ``runners/`` under that four in; the ``.py`` and ``.sh`` names on a folder's lines."""
    text = PAGE.read_text(encoding="utf-8")
    block = re.search(r"## Code layout\n+```text\n(.*?)^```", text, re.S | re.M)
    assert block, "docs/architecture.md has no code-layout tree"
    entries: list[str] = []
    stack: list[tuple[int, str]] = []  # (indent, folder path) of the folders the current line is inside
    for line in block.group(1).splitlines():
        folder = re.match(r"^( *)([\w.]+/)(?:\s|$)", line)
        if folder:
            indent = len(folder.group(1))
            stack = [(i, f) for i, f in stack if i < indent]
            path = (stack[-1][1] if stack else "") + folder.group(2)
            stack.append((indent, path))
            entries.append(path)
        if stack:
            entries += [stack[-1][1] + name for name in re.findall(r"\b[\w]+\.(?:py|sh)\b", line)]
    return entries


def test_the_layout_tree_is_read() -> None:
    entries = layout_entries()
    assert {"engine/", "engine/graphs/", "engine/engine.py", "models/decoder.py"} <= set(entries)


@pytest.mark.parametrize("path", layout_entries())
def test_every_folder_and_file_of_the_layout_exists(path: str) -> None:
    assert (REPO / path).exists(), f"docs/architecture.md's code layout names {path}, which does not exist"


def test_every_linked_page_exists() -> None:
    text = PAGE.read_text(encoding="utf-8")
    targets = {t for t in LINK.findall(text) if "://" not in t}
    assert targets, "the page links to no other page"
    missing = sorted(t for t in targets if not (PAGE.parent / t).exists())
    assert not missing, f"docs/architecture.md links to missing pages: {missing}"


@pytest.mark.parametrize(
    "path, folders, found",
    [
        ("engine/engine.py", [], True),
        ("engine/commands.py", [], False),  # the page once named it; it never existed
        ("cleanup.py", [REPO / "engine" / "step"], True),
        ("cleanup.py", [REPO / "engine" / "graphs"], False),
    ],
)
def test_the_check_tells_a_missing_path(path: str, folders: list[Path], found: bool) -> None:
    assert resolves(path, folders) is found
