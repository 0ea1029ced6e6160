"""docs/claims.md's RECL tables stay true to their own RECLs and to the Transformer-XL paper's table 8.

Each comparison row of those tables sets two ratios side by side: how much longer attnkit's Transformer-XL's RECL is
than that row's model, computed from the RECLs the row and its group's XL row print, and the paper's ratio for the
same pair of models at the same r, computed from table 8. Both are recomputed here, so a figure set beside the wrong
pair (the QRNN's 80% beside an LSTM, say) or the wrong r fails.
"""

from __future__ import annotations

import re
from pathlib import Path

CLAIMS = Path(__file__).resolve().parents[1] / "docs" / "claims.md"
SECTION = "## Relative effective context length (RECL)"
OURS = "the XL's RECL longer by, r = 0.1 / 0.5 / 1.0"
PAPERS = "the paper's, same pair (table 8)"

# Dai et al. 2019, table 8: RECL at r = 0.1, 0.5, 1.0, in two groups of equal parameter budget.
XL_151M, LSTM = (900, 800, 700), (400, 300, 200)
XL_128M, NO_RECURRENCE, TRANSFORMER = (700, 600, 500), (300, 300, 300), (128, 128, 128)
PAPER_PAIR = {"LSTM": (XL_151M, LSTM), "no recurrence": (XL_128M, NO_RECURRENCE),
              "vanilla": (XL_128M, TRANSFORMER)}


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end >= 0 else len(text)]


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def comparison_rows() -> list[dict[str, object]]:
    """Every row of the section's RECL tables that compares a model with its group's Transformer-XL."""
    rows, header, xl = [], None, None
    for line in section(CLAIMS.read_text(encoding="utf-8"), SECTION).splitlines():
        if not line.startswith("|"):
            header = None
            continue
        row = cells(line)
        if header is None:
            header = row
        elif OURS in header and not set(line) <= set("|-: "):
            by_name = dict(zip(header, row))
            recl = [by_name["RECL r = 0.1"], by_name["r = 0.5"], by_name["r = 1.0"]]
            if by_name["model"] == "Transformer-XL":
                xl = recl
            else:
                kind = next(k for k in PAPER_PAIR if by_name["model"].startswith(k))
                rows.append({"kind": kind, "xl": xl, "recl": recl, "ours": by_name[OURS],
                             "papers": by_name.get(PAPERS)})
    return rows


def recl(cell: str) -> tuple[int, bool]:
    """'≥ 512' -> (512, True): a RECL still above the threshold at the grid's end is a lower bound."""
    match = re.fullmatch(r"(≥ )?([\d,]+)", cell)
    assert match, f"not a RECL: {cell!r}"
    return int(match[2].replace(",", "")), match[1] is not None


def percent(longer: float, shorter: float) -> str:
    value = f"{(longer / shorter - 1) * 100:+.0f}%"
    return "0%" if value in ("+0%", "-0%") else value


def ours(xl_cell: str, other_cell: str) -> str:
    (xl, xl_at_least), (other, other_at_least) = recl(xl_cell), recl(other_cell)
    if other_at_least:
        return "not measured" if xl_at_least else f"≤ {percent(xl, other)}"
    return f"≥ {percent(xl, other)}" if xl_at_least else percent(xl, other)


def test_both_recl_tables_compare_each_model_with_the_xl():
    assert [row["kind"] for row in comparison_rows()] == ["LSTM", "no recurrence", "vanilla"] * 2


def test_attnkits_ratios_are_the_ratios_of_the_recls_the_tables_print():
    for row in comparison_rows():
        expected = " / ".join(ours(a, b) for a, b in zip(row["xl"], row["recl"]))
        assert row["ours"] == expected, row


def test_the_papers_ratios_are_table_8s_for_the_same_pair_and_r():
    for row in comparison_rows():
        xl, other = PAPER_PAIR[row["kind"]]
        expected = " / ".join(percent(a, b) for a, b in zip(xl, other))
        assert row["papers"] == expected, row
