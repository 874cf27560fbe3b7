"""Drawing the plan and the run (``figures.Picture``, ``figures.StageBars``) with matplotlib, the ``plot`` extra.

matplotlib is imported only when a picture is drawn; without it the command fails
in one line naming the extra (``cli.errors``). Figures are built with
``matplotlib.figure.Figure`` (no pyplot state, no display). Every source keeps one
colour (``source_colour``), in the plan and in the run, so the two pictures read
side by side.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

from zephon_core.report.figures import Picture, StageBars
from zephon_core.report.mixing_figures import MixingPicture

# The project's teal first, then colours apart in hue and lightness (bench/plot.py uses the same teal and amber).
PALETTE = ("#0b7a75", "#e0a526", "#6a4c93", "#c0392b", "#2c7fb8", "#7f8c8d", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
BOUNDARY = "#333333"
NOTE = "#555555"


def source_colour(s: int) -> str:
    """The colour of source number ``s`` (its place in the recipe), the same in every picture."""
    return PALETTE[s % len(PALETTE)]


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # the plot extra: imported only to draw

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _notes(fig: Any, notes: list[str]) -> None:
    if notes:
        fig.get_layout_engine().set(rect=(0, 0.035 * len(notes), 1, 1 - 0.035 * len(notes)))
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=8, color=NOTE, va="bottom")


def _boundaries(axes: list[Any], boundaries: list[tuple[float, str]]) -> list[Any]:
    """A dashed line where each stage begins on every panel, labelled along it (on its stage's side) in the top one.

    Stages first seen at the same point share the line, each label in its own column beside it (joined into one
    line they ran past the panel in short runs); a label longer than the panel is set smaller until it fits."""
    top = axes[0]
    labels_drawn = []
    at: dict[float, list[str]] = {}
    for x, label in boundaries:  # stages first seen at the same point share one line
        at.setdefault(x, []).append(label)
    for x, labels in at.items():
        for ax in axes:
            ax.axvline(x, color=BOUNDARY, lw=1.1, ls="--", zorder=3)
        text = top.text(
            x,
            0.97,
            "\n".join(" " + label for label in labels),
            transform=top.get_xaxis_transform(),
            rotation=90,
            va="top",
            ha="left",
            fontsize=8.5,
            color=BOUNDARY,
            zorder=4,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85},
        )
        labels_drawn.append(text)
    return labels_drawn


def _fit_height(fig: Any, ax: Any, texts: list[Any]) -> None:
    """Shrink each of ``texts`` (rotated along a line) until it fits in ``ax``'s height, as laid out."""
    fig.draw_without_rendering()  # the constrained layout sets the panels' sizes
    room = ax.get_window_extent().height * 0.95
    for text in texts:
        height = text.get_window_extent().height
        if height > room:
            text.set_fontsize(max(5.0, text.get_fontsize() * room / height))


def draw_picture(p: Picture) -> Any:
    """Two panels over the same x axis: the stacked share of each source, and the epochs of each source used."""
    fig = _figure(10.5, 6.8)
    share_ax, epoch_ax = fig.subplots(2, 1, sharex=True, height_ratios=(1.15, 1))
    bottom = np.zeros(len(p.edges))
    for s, name in enumerate(p.sources):
        values = np.append(p.shares[s], p.shares[s][-1:]) if p.shares.shape[1] else np.zeros(len(p.edges))
        share_ax.fill_between(p.edges, bottom, bottom + values, step="post", color=source_colour(s), label=name, lw=0)
        bottom = bottom + values
        epoch_ax.plot(p.at, p.epochs[s], color=source_colour(s), lw=2, label=name)
    share_ax.set_ylim(0, 1)
    share_ax.set_xlim(p.edges[0], p.edges[-1])
    share_ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    share_ax.set_ylabel(f"share of {p.share_of}")
    share_ax.set_title(f"share of {p.share_of} per source", fontsize=10, loc="left")
    handles, labels = share_ax.get_legend_handles_labels()  # listed top down, as the bands are stacked
    share_ax.legend(
        handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), title="source", frameon=False
    )
    epoch_ax.set_ylim(bottom=0)
    epoch_ax.set_ylabel("epochs used" if p.epochs_of == "epochs" else "documents delivered")
    epoch_ax.set_title(
        "epochs of each source used (documents / documents in the source)"
        if p.epochs_of == "epochs"
        else "documents of each source delivered",
        fontsize=10,
        loc="left",
    )
    epoch_ax.grid(axis="y", color="#dddddd", lw=0.8)
    epoch_ax.set_xlabel(p.x_label)
    labels = _boundaries([share_ax, epoch_ax], p.boundaries)
    for x in p.settled:
        for ax in (share_ax, epoch_ax):
            ax.axvline(x, color=BOUNDARY, lw=0.9, ls=":", zorder=3)
    if p.title:
        fig.suptitle(p.title, fontsize=12)
    _notes(fig, p.notes)
    _fit_height(fig, share_ax, labels)
    return fig


def draw_stage_bars(b: StageBars) -> Any:
    """One checkpoint: per stage the planned and the delivered shares as stacked bars, and the epochs used per stage."""
    fig = _figure(10.5, 2.4 + 1.1 * len(b.stages))
    share_ax, epoch_ax = fig.subplots(1, 2, width_ratios=(1.6, 1))
    labels, rows = [], []
    for i, stage in enumerate(b.stages):
        if b.planned is not None:
            labels.append(f"{stage}: planned {b.units[i]}")
            rows.append(b.planned[i])
        labels.append(f"{stage}: delivered {b.units[i]}")
        rows.append(b.delivered[i])
    y = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    for s, name in enumerate(b.sources):
        widths = np.array([r[s] for r in rows])
        share_ax.barh(y, widths, left=left, color=source_colour(s), label=name, height=0.7)
        left += widths
    share_ax.set_yticks(y, labels, fontsize=9)
    share_ax.set_xlim(0, 1)
    share_ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    share_ax.set_xlabel("share (each stage in the unit its weights share)")
    share_ax.set_title(
        "per stage: planned vs delivered shares" if b.planned is not None else "per stage: delivered shares",
        fontsize=10,
        loc="left",
    )
    width = 0.8 / max(len(b.sources), 1)
    x = np.arange(len(b.stages))
    for s, name in enumerate(b.sources):
        epoch_ax.bar(
            x + (s - (len(b.sources) - 1) / 2) * width, b.epochs[:, s], width, color=source_colour(s), label=name
        )
    epoch_ax.set_xticks(x, b.stages)
    epoch_ax.set_ylabel("epochs used" if b.epochs_of == "epochs" else "documents delivered")
    epoch_ax.set_title(
        "epochs of each source used, per stage" if b.epochs_of == "epochs" else "documents delivered, per stage",
        fontsize=10,
        loc="left",
    )
    epoch_ax.grid(axis="y", color="#dddddd", lw=0.8)
    epoch_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title="source", frameon=False)
    if b.title:
        fig.suptitle(b.title, fontsize=12)
    _notes(fig, b.notes)
    return fig


def draw_mixing(p: MixingPicture) -> Any:
    """A steered run: each source's decided weight (solid steps) against its realized share (thin), and below, the
    mean loss per token each decision saw (points at the decisions' steps)."""
    fig = _figure(10.5, 6.8)
    share_ax, loss_ax = fig.subplots(2, 1, sharex=True, height_ratios=(1.3, 1))
    x = [a for a, _, _ in p.spans] + [p.spans[-1][1]]
    for s, name in enumerate(p.sources):
        colour = source_colour(s)
        share_ax.stairs(p.weights[s], x, color=colour, lw=2.4, baseline=None, label=f"{name}: weight", zorder=3)
        share_ax.stairs(p.realized[s], p.realized_edges, color=colour, lw=1.2, baseline=None, ls=(0, (2, 1.5)),
                        label=f"{name}: realized")
        loss_ax.plot(p.decided_at, p.losses[s], color=colour, lw=1.5, marker="o", ms=4.5, label=name)
    top = np.nanmax(np.concatenate([p.weights.ravel(), p.realized.ravel(), [0.0]]))
    share_ax.set_ylim(0, min(1.0, top * 1.15 + 0.02))
    share_ax.set_xlim(min(0.0, x[0]), x[-1])  # from the run's start, where a checkpoint draws no recipe stage
    share_ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    share_ax.set_ylabel(f"share of {p.share_of}")
    share_ax.set_title(f"weight decided (journal) vs {p.realized_from}", fontsize=10, loc="left")
    share_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title="source", frameon=False, fontsize=8.5)
    share_ax.grid(axis="y", color="#dddddd", lw=0.8)
    loss_ax.set_ylabel("mean loss per token")
    loss_ax.set_title("the loss each decision saw (its interval, reduced over data-parallel groups)", fontsize=10,
                      loc="left")
    loss_ax.grid(axis="y", color="#dddddd", lw=0.8)
    loss_ax.set_xlabel("global step")
    loss_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title="source", frameon=False, fontsize=8.5)
    for at in p.decided_at:  # light: a run decides often, and the weights' steps already show where
        for ax in (share_ax, loss_ax):
            ax.axvline(at, color=BOUNDARY, lw=0.6, ls=":", alpha=0.6, zorder=1)
    fig.suptitle(p.title, fontsize=12)
    _notes(fig, p.notes)
    return fig


def write_png(fig: Any, path: str) -> None:
    fig.savefig(path, format="png")


def png_base64(fig: Any) -> str:
    """The figure as a base64 PNG, for a page that needs no other file."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")
