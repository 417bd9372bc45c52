"""``bayesmlc demo``: train on built-in synthetic data and print the test metrics beside those of a
trivial baseline (every row's labels ranked by their training frequency)."""

from __future__ import annotations

import time

import numpy as np

from ...evaluation import evaluate_model, format_metrics_table, label_frequency_baseline
from ..errors import EXIT_OK, CLIError
from ..output import device_name, emit, peak_rss_mb, progress
from ..threads import thread_note
from .train import build_model

#: the demo's data: binary bag-of-words features, so that every model (BMLS included) runs on it
DEMO_FEATURES = 500
DEMO_LABELS = 40
#: fewest rows ``demo --n-samples`` takes: a quarter is the test set
DEMO_MIN_SAMPLES = 100
#: settings the demo gives a model unless ``--set`` says otherwise: MLGPF at 30 epochs needs half the
#: CPU of its default 100, for a test P@1 within 1.5 standard errors of it and far above the
#: baseline's (docs/experiments.md, "The demo")
DEMO_SETTINGS = {"mlgpf": {"epochs": 30}}


def cmd_demo(args) -> int:
    from ...data.synthetic import make_multilabel
    from ...metrics import inverse_propensity

    if args.n_samples < DEMO_MIN_SAMPLES:
        raise CLIError(f"--n-samples {args.n_samples}: the demo needs at least {DEMO_MIN_SAMPLES} rows")
    data = make_multilabel(args.n_samples, DEMO_FEATURES, DEMO_LABELS, feature_kind="binary", random_state=args.seed)
    n_test = args.n_samples // 4
    train, test = data.subset(np.arange(n_test, data.n_samples)), data.subset(np.arange(n_test))
    settings = [f"{key}={value!r}" for key, value in DEMO_SETTINGS.get(args.model, {}).items()] + (args.set or [])
    model = build_model(args.model, settings, args.seed, args.device, args.quiet)
    shape = (f"{train.n_samples} train / {test.n_samples} test rows, {data.n_features} features, "
             f"{data.n_labels} labels")
    progress(f"demo: {args.model} on synthetic data ({shape}){thread_note(args)}", args.quiet)
    start = time.perf_counter()
    model.fit(train.X, train.Y)
    train_seconds = time.perf_counter() - start
    inv_prop = inverse_propensity(train.Y)
    result = evaluate_model(model, test, inv_prop)
    baseline = label_frequency_baseline(train.Y, test, inv_prop)
    record = {"model": args.model, "dataset": "synthetic-demo", "params": model.get_params(deep=False),
              "metrics": result.metrics, "baseline_metrics": baseline, "train_seconds": train_seconds,
              "predict_seconds": result.predict_seconds, "peak_rss_mb": peak_rss_mb(), "device": device_name(model)}
    table = (f"{args.model} on synthetic demo data: {shape} (train {train_seconds:.2f} s, predict "
             f"{result.predict_seconds:.2f} s)\nbaseline: every row gets the labels ranked by their training "
             "frequency, with that frequency as the probability\n"
             + format_metrics_table(result.metrics, baseline, (args.model, "baseline")))
    emit(args, record, table)
    return EXIT_OK
