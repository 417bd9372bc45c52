"""``bayesmlc predict``: each row's top-k labels with their probabilities (or raw scores)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from ..errors import EXIT_OK, CLIError
from ..run_directory import META_FILE
from .data_files import load_model_and_data
from .risk import is_risk_controller, write_label_sets
from .saved_run import names_from_meta


def cmd_predict(args) -> int:
    model, meta, data = load_model_and_data(args.model_dir, getattr(args, "allow_native_baselines", False), args.input,
                                            args.format, labels=False)
    names = names_from_meta(meta, "label_names", model.n_labels_, args.model_dir) if args.names else None
    if args.names and names is None:
        raise CLIError(f"--names: {Path(args.model_dir) / META_FILE} holds no label names")
    stream = _open_output(args.output, "--output") if args.output else sys.stdout  # before the work
    try:
        as_sets = is_risk_controller(model) and not args.scores  # its label sets, not the top-k
        if as_sets:
            write_label_sets(stream, model, data.X, names, args.json, header=not (args.json or args.quiet))
            indices, values = np.zeros((0, 0), dtype=np.int64), np.zeros((0, 0))
        else:
            indices, values = top_labels(model, data.X, args.top_k, raw_scores=args.scores)
        kind = "score" if args.scores else "probability"
        if not args.json and not args.quiet and not as_sets:
            stream.write(f"# top {indices.shape[1]} labels per row, best first, as label:{kind}"
                         f"{' (raw decision_function scores)' if args.scores else ''}\n")
        for row_idx, row_values in zip(indices, values):
            labels = [names[i] if names else int(i) for i in row_idx]
            if args.json:
                record = {"labels": labels, ("scores" if args.scores else "probabilities"): row_values.tolist()}
                stream.write(json.dumps(record) + "\n")
            else:
                stream.write(" ".join(f"{label}:{value:.6g}" for label, value in zip(labels, row_values)) + "\n")
        if args.output:
            stream.close()
    except OSError as exc:
        if not args.output or isinstance(exc, BrokenPipeError):
            raise
        raise CLIError(f"--output {args.output}: cannot write: {exc.strerror or exc}") from None
    finally:
        if args.output:
            try:
                stream.close()
            except OSError:
                pass
    return EXIT_OK


def top_labels(model, X, k: int, raw_scores: bool):
    """``(indices, values)``: each row's ``k`` best labels by the model's ranking
    (:meth:`~bayesmlc.base.MultiLabelEstimator.predict_topk`'s order, ties to the lower label), with
    their probabilities, or with the raw ``decision_function`` scores when ``raw_scores``; one batch of
    rows x L at a time, each scored once (``score_and_proba``)."""
    from ...base import PREDICT_BATCH_ROWS
    from ...metrics import topk
    from ...utils import iter_batches

    k = min(int(k), model.n_labels_)
    indices = np.empty((X.shape[0], k), dtype=np.int64)
    values = np.empty((X.shape[0], k), dtype=np.float32)
    for rows in iter_batches(X.shape[0], PREDICT_BATCH_ROWS):
        scores, proba = model.score_and_proba(X[rows])
        indices[rows], top_scores = topk(scores, k)
        values[rows] = top_scores if raw_scores else np.take_along_axis(proba, indices[rows], axis=1)
    return indices, values


def _open_output(path, option: str):
    try:
        return open(path, "w")
    except OSError as exc:
        raise CLIError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None
