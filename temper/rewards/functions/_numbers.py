"""Number extraction and comparison shared by the gsm8k and arithmetic rewards."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# An optionally signed number with optional thousands commas and decimals: -1,234.5
NUMBER = r"-?\$?\s*(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(NUMBER)
_HASHES_RE = re.compile(r"####\s*(" + NUMBER + r")")


def clean_number(text: str) -> str:
    """Strip ``$``, thousands commas, spaces and a trailing period: ``"$1,200."`` → ``"1200"``."""
    return text.replace("$", "").replace(",", "").replace(" ", "").rstrip(".")


def last_hashes_answer(text: str) -> str | None:
    """The number after the last ``#### `` marker (GSM8K answer convention), cleaned."""
    found = _HASHES_RE.findall(text)
    return clean_number(found[-1]) if found else None


def last_number(text: str) -> str | None:
    """The last number anywhere in ``text``, cleaned (verl's "flexible" extraction)."""
    for raw in reversed(_NUMBER_RE.findall(text)):
        cleaned = clean_number(raw)
        if cleaned not in ("", "-", "."):
            return cleaned
    return None


def numbers_equal(a: str, b: str) -> bool:
    """Exact decimal equality (``"18" == "18.00"``); falls back to string equality."""
    try:
        return Decimal(clean_number(a)) == Decimal(clean_number(b))
    except (InvalidOperation, ValueError):
        return clean_number(a) == clean_number(b)
