"""The figures themselves (matplotlib's Agg canvas): plot-history's title, whole-epoch ticks and time
axis from 0 with the set-up marked; scale.png's one quantity per panel row, a line and a legend entry
per configuration; the P@1-against-time subtitle naming only what is drawn."""

import json

import numpy as np
import pytest

from bayesmlc.bench.plots import _p1_plot, _scale_plot
from bayesmlc.bench.report import summarise
from bayesmlc.cli import main
from bayesmlc.gp.plotting import plot_history, setup_seconds

# an MLGPF-like history: set-up of 27 s, then epochs of 2 s
HISTORY = {"epoch": [1, 2, 3, 4, 5], "wall_time": [29.0, 31.0, 33.0, 35.0, 37.0],
           "objective": [-9.0, -6.0, -5.0, -4.5, -4.4], "train_P@1": [0.5, 0.6, 0.7, 0.72, 0.73],
           "val_P@1": [float("nan"), 0.55, float("nan"), 0.6, 0.61]}


def _setup_span(ax):
    spans = [p for p in ax.patches if p.get_label().startswith("set-up")]
    assert len(spans) == 1
    span = spans[0]
    if hasattr(span, "get_width"):  # a Rectangle (matplotlib >= 3.9)
        return span, float(span.get_x()), float(span.get_x() + span.get_width())
    xs = np.asarray(span.get_xy())[:, 0]  # a Polygon
    return span, float(np.min(xs)), float(np.max(xs))


def test_setup_seconds_by_hand():
    assert setup_seconds([29.0, 31.0, 33.0]) == (27.0, True)
    assert setup_seconds([5.0, 6.0, 6.5, 7.0]) == (4.5, True)  # median gap 0.5
    assert setup_seconds([0.1, 0.3, 0.5]) == (0.0, True)  # set-up shorter than rounding: clipped at 0
    assert setup_seconds([12.0]) == (12.0, False)


def test_plot_history_title_ticks_and_time_axis(tmp_path):
    figure = plot_history(HISTORY, tmp_path / "h.png", title="mlgpf on bibtex")
    assert (tmp_path / "h.png").stat().st_size > 0
    assert figure._suptitle.get_text() == "mlgpf on bibtex: 5 epochs, 37.0 s"
    time_ax, epoch_ax = figure.axes
    assert time_ax.get_xlim()[0] == 0.0 and time_ax.get_xlim()[1] >= 37.0
    span, start, end = _setup_span(time_ax)
    assert (start, end) == pytest.approx((0.0, 27.0))
    assert "27.0 s" in span.get_label()
    ticks = [t for t in epoch_ax.get_xticks() if epoch_ax.get_xlim()[0] <= t <= epoch_ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert epoch_ax.get_xlabel() == "epoch"
    labels = [line.get_label() for line in epoch_ax.get_lines()]
    assert labels == ["P@1 on training batches (running)", "P@1 on the validation rows"]
    np.testing.assert_array_equal(epoch_ax.get_lines()[1].get_xdata(), [2, 4, 5])  # evaluated epochs only


def test_plot_history_of_a_sampler_and_of_one_entry():
    figure = plot_history({"sweep": [1, 2, 3], "wall_time": [0.5, 1.0, 1.5], "objective": [-3.0, -2.0, -1.5]})
    assert figure._suptitle.get_text() == "Training history: 3 Gibbs sweeps, 1.5 s"
    (ax,) = figure.axes
    assert ax.get_xlim()[0] == 0.0 and _setup_span(ax)[2] == pytest.approx(0.0)
    figure = plot_history({"wall_time": [4.0], "objective": [-1.0]})
    span, _, end = _setup_span(figure.axes[0])
    assert end == 4.0 and span.get_label() == "set-up and the first logged step (4.0 s)"


def test_cli_plot_history_titles_the_run(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "history.json").write_text(json.dumps(HISTORY).replace("NaN", "null"))
    (folder / "meta.json").write_text(json.dumps({"model": "mlgpf", "dataset": "bibtex"}))
    assert main(["plot-history", "--model-dir", str(folder)]) == 0
    assert capsys.readouterr().out.strip() == str(folder / "history.png")
    assert (folder / "history.png").stat().st_size > 0


# ---- the bench plots ----------------------------------------------------------------------------
SHAPES = {
    "sweep-n2000": (1600, 2000, 400), "sweep-n8000": (6400, 2000, 400), "sweep-d8000": (1600, 8000, 400),
    "sweep-l1600": (1600, 2000, 1600), "eurlex-0.1": (1554, 5000, 3993), "eurlex-0.3": (4662, 5000, 3993),
    "amazoncat": (9489, 203882, 13330),
}
UNITS = {"bnmc": "pass", "omikuji_parabel": None, "bmls": "sweep", "mlgpf": "epoch"}  # rows come in a fixed order


def _scale_records():
    records = []
    for dataset, (n, d, l) in SHAPES.items():
        for model, unit in UNITS.items():
            records.append({
                "suite": "scale", "dataset": dataset, "model": model, "config": "speed", "status": "ok",
                "repeat": 0, "seed": 0, "baseline": model == "omikuji_parabel", "calibrate": None,
                "run_id": f"{dataset}/{model}/r0", "dataset_shape": {"n_train": n, "n_features": d, "n_labels": l},
                "train_seconds": 1.0 + n / 1000, "peak_rss_mb": 100.0 + d / 100 + hash(model) % 7,
                "seconds_per_epoch": None if unit is None else n * (1 + len(model)) / 1e4, "epoch_unit": unit,
                "metrics": {},
            })
    return records


def test_scale_plot_one_quantity_per_row_and_a_line_per_configuration(tmp_path):
    figure = _scale_plot([s for s in summarise(_scale_records()) if s.records], tmp_path / "scale.png")
    assert (tmp_path / "scale.png").stat().st_size > 0
    axes = [ax for ax in figure.axes if ax.get_visible()]
    rows = [axes[i:i + 3] for i in range(0, len(axes), 3)]
    quantities = [row[0].get_ylabel() for row in rows]
    assert quantities == ["seconds per epoch", "seconds per Gibbs sweep", "seconds per pass", "peak memory (MB)"]
    for row, model in zip(rows, ("mlgpf", "bmls", "bnmc", None)):
        assert len({ax.get_ylabel() for ax in row}) == 1
        for ax, dim in zip(row, ("N", "D", "L")):
            assert ax.get_xlabel().startswith(dim)
            names = [line.get_label() for line in ax.get_lines()]
            assert [t.get_text() for t in ax.get_legend().get_texts()] == names  # a legend entry per line
            expected_models = [model] if model else list(UNITS)
            if dim == "N":  # two families differ in N only: the synthetic sweep and the EURLex shape
                assert names == [f"{m} (speed), {fam}" for m in expected_models
                                 for fam in ("D=2,000, L=400", "D=5,000, L=3,993")]
                sweep = ax.get_lines()[0]
                np.testing.assert_array_equal(sweep.get_xdata(), [1600, 6400])
                if model:
                    expected = [n * (1 + len(model)) / 1e4 for n in (1600, 6400)]
                    np.testing.assert_allclose(sweep.get_ydata(), expected)
            else:
                assert names == [f"{m} (speed)" for m in expected_models]
                np.testing.assert_array_equal(ax.get_lines()[0].get_xdata(),
                                              [2000, 8000] if dim == "D" else [400, 1600])
    assert "not drawn" in figure._suptitle.get_text() and "amazoncat" in figure._suptitle.get_text()


def _p1_records(repeats):
    records = []
    for model, base in (("logistic", 0.6), ("mlgpf", 0.7)):
        for repeat in range(repeats):
            records.append({"suite": "quick", "dataset": "scene", "model": model, "config": "default", "status": "ok",
                            "repeat": repeat, "seed": repeat, "baseline": model == "logistic", "calibrate": None,
                            "run_id": f"scene/{model}/r{repeat}", "train_seconds": 1.0 + repeat,
                            "metrics": {"P@1": base + 0.01 * repeat}})
    return records


def test_p1_subtitle_names_only_what_is_drawn(tmp_path):
    summaries = [s for s in summarise(_p1_records(1)) if s.records]
    colours = {s.label: "C0" for s in summaries}
    figure = _p1_plot("scene", summaries, tmp_path, tmp_path / "a.png", colours)
    (ax,) = figure.axes
    title = ax.get_title()
    assert "bars" not in title and "median" not in title and "lines" not in title
    assert not ax.containers and not ax.get_lines()  # no error bars, no curves
    assert "hollow markers: reference runs" in title  # scene has a reference kNN run with its seconds
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == ["logistic (default)", "mlgpf (default)"]

    summaries = [s for s in summarise(_p1_records(3)) if s.records]
    figure = _p1_plot("scene", summaries, tmp_path, tmp_path / "b.png", colours)
    (ax,) = figure.axes
    assert "median over repeats; bars: minimum to maximum" in ax.get_title()
    assert len(ax.containers) == 2  # one error bar per configuration
    offsets = ax.collections[0].get_offsets()
    np.testing.assert_allclose(offsets, [[2.0, 61.0]])  # medians of 1, 2, 3 s and 60, 61, 62 %
