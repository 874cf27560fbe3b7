"""``zephon report``'s table, as text for the terminal and as one self-contained HTML page.

Both are made from the same blocks (``blocks``): a heading, then per stage and in
total, per source, tokens, documents, their shares, the stage's planned share in
the unit its weights share and the difference, and the epochs used.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from zephon_core.report.figures import StageFigures, fractions, shares_of, stage_figures
from zephon_core.report.history import Run

STAGE_COLUMNS = ["source", "tokens", "share", "documents", "share", "planned", "vs plan", "epochs"]
TOTAL_COLUMNS = ["source", "tokens", "share", "documents", "share", "epochs"]


@dataclass(frozen=True)
class Block:
    """One table: its heading line and its rows of cells (the first row the column names)."""

    heading: str
    rows: list[list[str]]


def _percent(v: float) -> str:
    return f"{v:.1%}"


def _epochs(v: float) -> str:
    return "?" if math.isnan(v) else f"{v:.3f}"


def _steps(st: StageFigures, entered: tuple[int, int | None] | None = None) -> str:
    if st.first_step is None:
        return ""
    every = f", every lane in it from step {entered[1]}" if entered and entered[1] not in (None, st.first_step) else ""
    return f"; steps {st.first_step}..{st.last_step}{every}"


def _heading(st: StageFigures, run: Run) -> str:
    delivered = f"{int(st.tokens.sum()):,} tokens, {int(st.documents.sum()):,} documents"
    if st.index is None:
        return f"total: {delivered}{_steps(st)}"
    entered = run.entered[st.index] if run.entered and st.index < len(run.entered) else None
    weights = f" (weight_by={st.weight_by})" if st.weight_by else ""
    return f"stage {st.index} {st.name!r}{weights}: {delivered if st.tokens.sum() else 'nothing yet'}{_steps(st, entered)}"


def _block(st: StageFigures, run: Run) -> Block:
    """One stage's table (or the total's): the planned share is held against the share of the unit it is in."""
    token_shares, doc_shares = shares_of(st.tokens), shares_of(st.documents)
    compared = st.delivered_shares()
    rows = [TOTAL_COLUMNS if st.index is None else [*STAGE_COLUMNS[:5], f"plan ({st.weight_by or '?'})", *STAGE_COLUMNS[6:]]]
    for s, name in enumerate(run.curriculum.sources):
        row = [name, f"{int(st.tokens[s]):,}", _percent(token_shares[s]), f"{int(st.documents[s]):,}", _percent(doc_shares[s])]
        if st.index is not None:
            if st.planned is None or compared is None:
                row += ["?", ""]
            else:
                off = (compared[s] - st.planned[s]) * 100 if st.tokens.sum() else math.nan
                row += [_percent(st.planned[s]), "" if math.isnan(off) else f"{off:+.1f} pt"]
        rows.append([*row, _epochs(st.epochs[s])])
    return Block(_heading(st, run), rows)


def _lanes_line(run: Run) -> str:
    where = ", ".join(f"{name} {n}" for name, n in zip(run.curriculum.stages, run.lanes_in_stage) if n)
    seen = f"of {run.lanes} lanes seen; canonical_replicas {run.canonical_replicas}"
    return f"lanes now in stage: {where or 'none'} ({seen})"


def _footer(run: Run) -> list[str]:
    padding, cut = fractions(run)
    pad = (
        f"{padding:.2%} of row tokens"
        if padding is not None
        else "not known (audit logs carry no row size; pass --recipe, and --seq-len and --batch-size with a "
        "training one)"
    )
    trunc = (
        f"{cut:.1%} of row stretches continue a document cut at a row boundary"
        if cut is not None
        else "not recorded in audit logs (a checkpoint's tallies have it)"
    )
    lines = [f"padding: {pad}", f"truncation: {trunc}"]
    c = run.curriculum
    unknown = [n for n, size in zip(c.sources, c.sizes) if not size]
    if unknown:
        lines.append(
            f"epochs: ? for {', '.join(unknown)}: the input does not record the size of "
            f"{'this source' if len(unknown) == 1 else 'these sources'}; pass --recipe RECIPE to count them"
        )
    elif c.sizes_from:
        lines.append(f"epochs: documents delivered / documents in the source (sizes from {c.sizes_from})")
    return lines + [f"note: {n}" for n in run.notes]


def blocks(run: Run) -> tuple[list[str], list[Block], list[str]]:
    """The heading lines (the first one after what was read, ``run.read``), the per-stage and total tables,
    and the lines under them."""
    h = run.history
    if h.every_step:
        steps = f"steps {int(h.steps[0])}..{int(h.steps[-1])}"
    else:
        shown = ", ".join(str(int(s)) for s in h.steps[-4:])
        steps = f"at step{'s' if len(h.steps) > 1 else ''} {'.., ' if len(h.steps) > 4 else ''}{shown}"
    head = [f"{int(h.batches[-1]):,} batches, {steps}", _lanes_line(run)]
    figures = stage_figures(run)
    return head, [_block(st, run) for st in figures], _footer(run)


def _aligned(block: Block) -> list[str]:
    widths = [max(len(r[i]) for r in block.rows) for i in range(len(block.rows[0]))]
    lines = [block.heading]
    for r in block.rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def as_text(run: Run) -> str:
    """The report as the terminal shows it."""
    head, tables, foot = blocks(run)
    lines = [f"{run.read}: {head[0]}", *head[1:]]
    for b in tables:
        lines += ["", *_aligned(b)]
    return "\n".join([*lines, "", *foot])


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:70em}
table{border-collapse:collapse;margin:.3em 0 1.2em}
td,th{padding:.15em .7em;text-align:right;border-bottom:1px solid #ddd}
td:first-child,th:first-child{text-align:left}h2{font-size:1em;margin:1em 0 .2em}img{max-width:100%}p{margin:.2em 0}
.foot{color:#555}"""


def as_html(run: Run, title: str, pictures: list[str]) -> str:
    """One page holding the table and ``pictures`` (base64 PNGs): no other file, nothing fetched.

    ``title`` heads the page once: the pictures are drawn without it, and the lines under it do not repeat it."""
    head, tables, foot = blocks(run)
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{e(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    out += [f"<p>{e(line)}</p>" for line in head]
    for png in pictures:
        out.append(f'<p><img alt="the run over its steps" src="data:image/png;base64,{png}"></p>')
    for b in tables:
        out.append(f"<h2>{e(b.heading)}</h2><table>")
        out.append("<tr>" + "".join(f"<th>{e(c)}</th>" for c in b.rows[0]) + "</tr>")
        out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in b.rows[1:]]
        out.append("</table>")
    out += [f'<p class="foot">{e(line)}</p>' for line in foot]
    return "\n".join([*out, "</body></html>", ""])
