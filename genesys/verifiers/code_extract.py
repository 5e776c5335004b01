"""Finding the program in a completion: the last fenced code block, preferring the task's language."""

from __future__ import annotations

import re

# Fence info strings that name each language.
LANGUAGE_ALIASES = {
    "python": ("python", "python3", "py", "py3"),
    "cpp": ("cpp", "c++", "cc", "cxx", "c"),
    "rust": ("rust", "rs"),
    "javascript": ("javascript", "js", "node", "nodejs", "mjs"),
}
_ALIAS_TO_LANGUAGE = {alias: language for language, aliases in LANGUAGE_ALIASES.items() for alias in aliases}
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$",
    re.M | re.S,
)
_OPEN_FENCE = re.compile(r"^[ \t]*(?:`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*)\Z", re.M | re.S)


def normalize_language(name: str) -> str | None:
    """'Python3' -> 'python', 'C++' -> 'cpp'; None for a language genesys does not run."""
    return _ALIAS_TO_LANGUAGE.get(name.strip().lower())


def _fence_language(info: str) -> str | None:
    word = info.strip().split()[0] if info.strip() else ""
    return normalize_language(word.strip("{}.")) if word else None


def extract_code(completion: str, language: str) -> str | None:
    """The last fenced block tagged with `language`, else the last fenced block of any kind.

    A final block the completion never closed counts only when there is no closed block at all.
    Returns None when the completion holds no fenced block.
    """
    blocks = [(_fence_language(m.group("info")), m.group("body")) for m in _FENCE.finditer(completion)]
    if not blocks:
        tail = _OPEN_FENCE.search(completion)
        if tail is None:
            return None
        blocks = [(_fence_language(tail.group("info")), tail.group("body"))]
    matching = [body for tag, body in blocks if tag == language]
    return (matching or [body for _, body in blocks])[-1]
