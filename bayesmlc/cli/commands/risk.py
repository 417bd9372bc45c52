"""``bayesmlc train --risk RISK=TARGET`` and ``bayesmlc predict`` of its label sets: the command-line
side of :class:`bayesmlc.risk_control.RiskController`."""

from __future__ import annotations

import argparse
import json

from ..argument_types import positive_int

__all__ = ["parse_risk", "add_risk_arguments", "wrap_for_risk", "risk_record", "write_label_sets", "is_risk_controller",
           "format_risk"]

#: ``--risk`` names: the risk, and what its target (1 - alpha) is a level of
RISK_TARGETS = {"recall": "recall", "precision": "precision", "selective": "accuracy of the answered rows"}


def parse_risk(text: str) -> tuple[str, float]:
    """``RISK=TARGET`` (``recall=0.9``) to ``(risk, alpha)`` with alpha = 1 - TARGET; an
    ``argparse.ArgumentTypeError`` naming what is wrong otherwise."""
    name, equals, value = text.partition("=")
    if not equals or name not in RISK_TARGETS:
        raise argparse.ArgumentTypeError(f"{text!r}: give RISK=TARGET with RISK one of {', '.join(RISK_TARGETS)} "
                                         "(e.g. recall=0.9)")
    try:
        target = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: TARGET must be a number, got {value!r}") from None
    if not 0 < target < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: TARGET (the {RISK_TARGETS[name]} to guarantee) must lie strictly "
                                         "between 0 and 1")
    return name, round(1.0 - target, 12)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text} must lie strictly between 0 and 1")
    return value


def add_risk_arguments(parser) -> None:
    """``train``'s options of risk control."""
    parser.add_argument("--risk", type=parse_risk, metavar="RISK=TARGET",
                        help="label sets with a guarantee (docs/risk-control.md): recall=0.9 (conformal risk control, "
                             "expected recall >= 0.9), precision=0.9 (Learn then Test, precision >= 0.9 with "
                             "probability >= 1 - delta) or selective=0.9 (top-1 or abstain, accuracy of the answered "
                             "rows >= 0.9 with probability >= 1 - delta); the threshold is calibrated on "
                             "--risk-calibration-fraction of the training rows, held out at random (--seed) from the "
                             "model's fit (default: none, predict lists the top-k)")
    parser.add_argument("--risk-delta", type=_fraction, default=0.1, metavar="DELTA",
                        help="with --risk: the guarantee fails with probability at most DELTA (precision, selective; "
                             "default 0.1)")
    parser.add_argument("--risk-calibration-fraction", type=_fraction, default=0.2, metavar="F",
                        help="with --risk: the share of training rows held out to calibrate on (default 0.2)")
    parser.add_argument("--risk-top-k", type=positive_int, default=100, metavar="K",
                        help="with --risk: candidate labels per row; a true label outside them is always missed "
                             "(default 100)")


def wrap_for_risk(args, model):
    """``model`` wrapped in a :class:`~bayesmlc.risk_control.RiskController` when ``--risk`` is given."""
    if getattr(args, "risk", None) is None:
        return model
    from ...risk_control import RiskController

    risk, alpha = args.risk
    return RiskController(model, risk=risk, alpha=alpha, delta=args.risk_delta, top_k=args.risk_top_k,
                          calibration_fraction=args.risk_calibration_fraction, random_state=args.seed)


def risk_record(model, test=None) -> dict | None:
    """The JSON record's ``risk_control`` of a RiskController (None for another model): its calibration,
    and on the ``test`` set the realised risk, mean set size and coverage (None without one)."""
    from ...risk_control import RiskController

    if not isinstance(model, RiskController):
        return None
    figures = ({"realised_risk": None, "mean_set_size": None, "coverage": None} if test is None
               else model.evaluate(test.X, test.Y, test.label_mask))
    return {**model.summary(), **figures}


def write_label_sets(stream, model, X, names, as_json: bool, header: bool) -> None:
    """``bayesmlc predict`` of a RiskController: each row's label set, best first, with probabilities;
    an empty line (JSON: empty lists) for a row left without labels or abstained on."""
    from ...base import PREDICT_BATCH_ROWS
    from ...utils import iter_batches

    if header:
        target = f"{RISK_TARGETS[model.risk]} >= {1 - model.alpha:g}"
        stream.write(f"# label sets ({model.risk}: {target}, method {model.method_}, threshold "
                     f"{model.threshold_:.6g}), best first, as label:probability\n")
    for rows in iter_batches(X.shape[0], PREDICT_BATCH_ROWS):
        proba = model.predict_proba(X[rows])
        sets = model._sets_from_proba(proba)
        for i in range(sets.shape[0]):
            labels = sets.indices[sets.indptr[i]:sets.indptr[i + 1]]
            values = proba[i, labels]
            order = sorted(range(labels.size), key=lambda j: (-values[j], labels[j]))
            shown = [names[labels[j]] if names else int(labels[j]) for j in order]
            probabilities = [float(values[j]) for j in order]
            if as_json:
                stream.write(json.dumps({"labels": shown, "probabilities": probabilities}) + "\n")
            else:
                stream.write(" ".join(f"{label}:{value:.6g}" for label, value in zip(shown, probabilities)) + "\n")


def is_risk_controller(model) -> bool:
    """Whether ``model`` is a :class:`~bayesmlc.risk_control.RiskController` (``predict`` prints its sets)."""
    from ...risk_control import RiskController

    return isinstance(model, RiskController)


def format_risk(record: dict) -> str:
    """The table line of a ``risk_control`` record."""
    threshold = "none (no label)" if record["threshold"] is None else f"{record['threshold']:.6g}"
    line = (f"risk control: {record['risk']} alpha={record['alpha']:g} delta={record['delta']:g} "
            f"({record['method']}, {record['calibration_rows']} calibration rows): threshold {threshold}"
            + ("" if record["feasible"] else " (target not met on the calibration rows: no guarantee)"))
    if record.get("realised_risk") is not None or record.get("coverage") is not None:
        risk = "–" if record["realised_risk"] is None else f"{record['realised_risk']:.4f}"
        line += (f"\n  on the test rows: realised risk {risk}, mean set size {record['mean_set_size']:.3g}, "
                 f"coverage {record['coverage']:.3f}")
    return line
