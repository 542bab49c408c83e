"""Figure 1's names: every run named in every panel, no name's text box over another's or
over a title, axis label or legend entry, even where the points crowd together."""

from __future__ import annotations

import itertools
import json

import pytest
from matplotlib.text import Annotation, Text
from test_cost_model import TAU1, TAU10, bandwidth_report, run_report, write

from moecache.report import figures

# Crowded as the embedded default's runs are: five lossless runs within a few tokens/s of
# each other, the all-resident run apart, restricting runs near each other above them.
RUNS = [
    ("all", "all", 4.0, 0.0, 0.0),
    ("lru", "lru", 3.9, 0.20, 0.0),
    ("lfu", "lfu", 3.9, 0.19, 0.0),
    ("s3-fifo", "s3-fifo", 3.9, 0.195, 0.0),
    ("decayed-frequency", "decayed-frequency", 3.95, 0.19, 0.0),
    ("farthest-future", "farthest-future", 4.1, 0.13, 0.0),
    ("dwell-16", "dwell", 4.2, 0.03, 0.153),
    ("dwell-64", "dwell", 4.15, 0.025, 0.161),
    ("static", "static", 4.18, 0.022, 0.155),
    ("controller-t50", "controller", 4.2, 0.02, 0.124),
    ("controller-t90", "controller", 4.3, 0.008, 0.109),
]


@pytest.fixture
def crowded_fig1(tmp_path):
    runs = [
        write(tmp_path, run_report(run, policy, c, n, TAU1, noise=0.02, delta_nll=loss))
        for run, policy, c, n, loss in RUNS
    ]
    scaled = [
        write(tmp_path, run_report(run, policy, c, n, TAU10, multiplier=10, delta_nll=loss))
        for run, policy, c, n, loss in RUNS
        if run in ("lru", "farthest-future", "static", "dwell-16")
    ]
    bandwidth = tmp_path / "own.json"
    bandwidth.write_text(json.dumps(bandwidth_report()))
    fig, _ = figures.fig1(runs, scaled, [bandwidth])
    fig.canvas.draw()
    yield fig
    figures.plt.close(fig)


def text_boxes(fig):
    """(text, box) of every name, title, axis label and legend entry of the figure (tick
    labels stay outside the panels, where no name goes). An annotation's box is its
    text's, its leader line apart."""
    renderer = fig.canvas.get_renderer()
    texts = [fig._suptitle, *(t for legend in fig.legends for t in legend.get_texts())]
    for ax in fig.axes:
        texts += [*ax.texts, ax.title, ax.xaxis.label, ax.yaxis.label]
    return [
        (text, Text.get_window_extent(text, renderer))
        for text in texts
        if text is not None and text.get_visible() and text.get_text().strip()
    ]


def test_fig1_names_every_run_once_in_every_panel(crowded_fig1):
    for ax in crowded_fig1.axes:
        names = sorted(t.get_text() for t in ax.texts if isinstance(t, Annotation))
        assert names == sorted(run for run, *_ in RUNS)


def test_no_text_of_fig1_overlaps_another(crowded_fig1):
    overlapping = [
        (a.get_text(), b.get_text())
        for (a, box_a), (b, box_b) in itertools.combinations(text_boxes(crowded_fig1), 2)
        if box_a.overlaps(box_b)
    ]
    assert overlapping == []


def test_fig1_names_stay_inside_their_panel(crowded_fig1):
    renderer = crowded_fig1.canvas.get_renderer()
    for ax in crowded_fig1.axes:
        inside = ax.get_window_extent(renderer)
        for text in ax.texts:
            box = Text.get_window_extent(text, renderer)
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1, text.get_text()
            assert inside.y0 <= box.y0 and box.y1 <= inside.y1, text.get_text()


def test_the_old_stagger_would_have_been_caught(crowded_fig1):
    """The check can fail: two names written at the same place overlap."""
    ax = crowded_fig1.axes[0]
    ax.annotate("lru", (180, 0), xytext=(3, 3), textcoords="offset points", fontsize=7)
    ax.annotate("lfu", (181, 0), xytext=(3, 3), textcoords="offset points", fontsize=7)
    crowded_fig1.canvas.draw()
    boxes = [box for text, box in text_boxes(crowded_fig1) if text in ax.texts[-2:]]
    assert boxes[0].overlaps(boxes[1])
