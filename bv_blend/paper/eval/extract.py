"""Answer extraction from model outputs: the last ``\\boxed{...}`` (nested braces) and multiple-choice letters."""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if none.

    ``\\boxed 5`` (no braces, as some models write a single token) gives ``"5"``.
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    while start >= 0:
        cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
        i = start + len(cmd)
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
        elif i < len(text) and i > start + len(cmd):
            match = re.match(r"[^\s$]+", text[i:])
            if match:
                return match.group(0)
        # unbalanced or empty: try the previous box
        start = max(text.rfind(cmd, 0, start) for cmd in _BOX_COMMANDS)
    return None


def _letter_patterns(letters: str) -> list[re.Pattern[str]]:
    # Only "answer"/"option" ignore case: the letter must be a capital, or "the answer is a multiple of 3"
    # would read as option A.
    cls = f"[{letters}]"
    return [
        # "the answer is (D)", "The correct answer is: D", "answer is option C"
        re.compile(rf"(?i:answer)\s*(?:is|:)\s*:?\s*(?:(?i:option)\s*)?\(?\s*({cls})\b\s*\)?"),
        # "Answer: C", "**Answer:** (B)", "Final answer - B"
        re.compile(rf"(?i:answer)\W{{0,4}}\(?\s*({cls})\b\s*\)?"),
        # "(B)" on its own
        re.compile(rf"\(\s*({cls})\s*\)"),
    ]


def extract_choice(text: str, num_options: int) -> str | None:
    """The option letter a response picks (A.. for ``num_options`` options), or None.

    Order of trust: a boxed letter (``\\boxed{C}``, ``\\boxed{\\text{(C)}}``), then the last
    "answer is X" / "Answer: X", then the last "(X)", then a response that is just the letter.
    """
    if not 1 <= num_options <= 26:
        raise ValueError(f"num_options must be in 1..26, got {num_options}")
    letters = "".join(chr(ord("A") + i) for i in range(num_options))
    boxed = extract_boxed(text)
    if boxed is not None:
        inner = re.sub(r"\\text\w*\{([^{}]*)\}", r"\1", boxed)
        match = re.fullmatch(rf"\s*\(?\s*([{letters}])\s*[).:]?.*", inner, flags=re.DOTALL)
        if match:
            return match.group(1)
    for pattern in _letter_patterns(letters):
        found = pattern.findall(text)
        if found:
            return found[-1]
    bare = re.fullmatch(rf"\s*\(?([{letters}])[).:]?\s*", text)
    return bare.group(1) if bare else None
