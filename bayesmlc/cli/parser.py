"""The argument parser of ``bayesmlc``: one sub-parser per command, the options they share, and the
argument types that turn a bad value into a one-line error naming the option (exit code 2)."""

from __future__ import annotations

import argparse

from .commands import (cmd_bench, cmd_demo, cmd_evaluate, cmd_info, cmd_plot_history, cmd_predict, cmd_topics,
                       cmd_train)
from .commands.demo import DEMO_FEATURES, DEMO_LABELS, DEMO_MIN_SAMPLES, DEMO_SETTINGS
from .commands.risk import add_risk_arguments
from .errors import EXIT_USAGE
from .output import printable
from .argument_types import non_negative_int, positive_int, thread_count


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``bayesmlc train: error: ...``), exit code 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {printable(' '.join(message.split()))} "
                              f"(see {self.prog} --help)\n")


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions to the terminal but keeps an epilog of examples line by line, so that an
    example command stays on one line and can be copied."""

    def _fill_text(self, text, width, indent):
        if text.startswith("example"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; ``parse_args`` leaves the command's function in ``args.func``."""
    from .. import __version__

    parser = _Parser(prog="bayesmlc", description="Bayesian multi-label classification at scale",
                     epilog="start with 'bayesmlc demo'; 'bayesmlc COMMAND --help' lists a command's options "
                            "and gives an example")
    parser.add_argument("--version", action="version", version=f"bayesmlc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, help, example, description=None):
        return sub.add_parser(name, help=help, description=description or help[0].upper() + help[1:] + ".",
                              epilog="example:\n  " + example, formatter_class=_HelpFormatter)

    for add_command in (_add_train, _add_evaluate, _add_predict, _add_info, _add_demo, _add_topics,
                        _add_plot_history, _add_bench):
        add_command(command)
    return parser


def _add_common(p, model=True, data=True,
                json_help="print one JSON object as the last line of stdout (default: a table)",
                quiet_help="no progress output on stderr (default: progress shown)") -> None:
    """The options every computing command takes: output style, input format, model settings, threads."""
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("--quiet", action="store_true", help=quiet_help)
    if data:
        p.add_argument("--format", default=None,
                       help="input format: xc, arff, svmlight, mat or npz (default: from the file extension)")
    if model:
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="a model parameter, repeatable (default: the model's own)")
        p.add_argument("--seed", type=non_negative_int, default=0, help="random_state of the model (default 0)")
        p.add_argument("--device", default=None, help="auto, cpu or cuda (default: the model's)")
    p.add_argument("--threads", type=thread_count, default=None, metavar="N",
                   help="CPU threads (default: one per idle core, fewer when other processes keep the cores busy)")
    p.set_defaults(choose_threads=True)


def _model_names():
    from ..models import MODEL_CLASSES

    return sorted(MODEL_CLASSES)


def _models_help(what: str) -> str:
    """``--model``'s help: ``what``, then the models, those of the ``[compare]`` extra marked so."""
    from ..models import INSTALL_COMPARE, model_label

    return (f"{what}: {', '.join(model_label(name) for name in _model_names())} ([compare]: "
            f"needs the optional extra, {INSTALL_COMPARE.replace('install it with: ', '')})")


def _add_train(command) -> None:
    p = command("train", "fit a model, optionally score a test file",
                "bayesmlc train --model logistic --train train.txt --test test.txt --set C=4 --out runs/lr")
    p.add_argument("--model", required=True, choices=_model_names(), metavar="NAME",
                   help=_models_help("model to fit (required)"))
    p.add_argument("--train", required=True, metavar="FILE", help="training data file (required)")
    p.add_argument("--test", metavar="FILE", help="test data file; its metrics are printed (default: none)")
    p.add_argument("--out", metavar="DIR",
                   help="folder for the model, history and metrics, written whole or not at all (default: not saved)")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out (default: refuse)")
    p.add_argument("--propensity", type=_propensity, metavar="A,B|DATASET",
                   help="constants (A, B) of Jain et al.'s propensity model for PSP@k and PSnDCG@k: two numbers, "
                        "or the name of a registered data set whose constants to take (default: 0.55,1.5)")
    p.add_argument("--distributed", action="store_true",
                   help="data-parallel training under torchrun (mlgpf, bnmc; see docs/scaling.md; default: one process)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the model's checkpoint (mlgpf: --set checkpoint_path=...; default: start afresh)")
    p.add_argument("--preset", metavar="NAME",
                   help="a named configuration of the model: fast, paper or best (default: none, the model's "
                        "defaults); --set overrides its values; 'bayesmlc info --presets' lists them with "
                        "their measured figures")
    p.add_argument("--calibrate", choices=("isotonic", "temperature", "platt"),
                   help="fit on 80%% of the training rows and recalibrate the probabilities on the other 20%% "
                        "(bayesmlc.calibration.CalibratedClassifier; default: not recalibrated)")
    p.add_argument("--calibration-folds", type=int, metavar="K",
                   help="with --calibrate: fit the maps on K-fold held-out predictions (every row held out once) "
                        "and train the model on all rows, K + 1 fits (default: one 80/20 split)")
    add_risk_arguments(p)
    _add_common(p)
    p.set_defaults(func=cmd_train)


def _add_allow_native(p) -> None:
    p.add_argument("--allow-native-baselines", action="store_true",
                   help="load a napkinxc_plt or omikuji_* model, whose files a native library reads trusting "
                        "them: only for a run folder you trust (default: such a model is refused)")


def _add_evaluate(command) -> None:
    p = command("evaluate", "score a saved model on a test file",
                "bayesmlc evaluate --model-dir runs/lr --test test.txt --json")
    p.add_argument("--model-dir", required=True, metavar="DIR", help="folder written by 'train --out' (required)")
    p.add_argument("--test", required=True, metavar="FILE", help="test data file (required)")
    _add_allow_native(p)
    _add_common(p, model=False)
    p.set_defaults(func=cmd_evaluate)


def _add_predict(command) -> None:
    p = command("predict", "top-k labels per row of a file",
                "bayesmlc predict --model-dir runs/lr --input test.txt --top-k 5 --names",
                description="Print each row's top-k labels with their probabilities (predict_proba): a '#' "
                            "header line, then 'label:probability ...' per row, best first. --scores prints "
                            "the raw decision_function scores instead; --json prints one JSON object per row "
                            "({\"labels\": [...], \"probabilities\": [...]}) and no header; --quiet drops "
                            "the header and the progress output.")
    p.add_argument("--model-dir", required=True, metavar="DIR", help="folder written by 'train --out' (required)")
    p.add_argument("--input", required=True, metavar="FILE", help="data file to predict, any supported format (required)")
    p.add_argument("--top-k", type=positive_int, default=5, metavar="K", help="labels printed per row (default 5)")
    p.add_argument("--output", metavar="FILE", help="write here (default: stdout)")
    p.add_argument("--names", action="store_true", help="print label names (default: label indices)")
    p.add_argument("--scores", action="store_true",
                   help="print raw decision_function scores (default: probabilities from predict_proba)")
    _add_allow_native(p)
    _add_common(p, model=False,
                json_help="one JSON object per row, {\"labels\": [...], \"probabilities\": [...]}, and no "
                          "header (default: 'label:probability ...' lines)",
                quiet_help="no '#' header line and no progress output on stderr (default: both shown)")
    p.set_defaults(func=cmd_predict)


def _add_info(command) -> None:
    p = command("info", "statistics of a data file, the models or their presets", "bayesmlc info train.txt --json")
    p.add_argument("path", nargs="?", metavar="FILE",
                   help="data file, any supported format (required unless --presets or --models)")
    p.add_argument("--presets", action="store_true",
                   help="list the presets of every model with their measured figures (default: off)")
    p.add_argument("--models", action="store_true",
                   help="list the models, [compare] marking those that need the optional extra, and whether "
                        "this installation can run each (default: off)")
    _add_common(p, model=False)
    p.set_defaults(func=cmd_info)


def _add_demo(command) -> None:
    settings = "; ".join(f"{name}: {', '.join(f'{k}={v}' for k, v in values.items())}"
                         for name, values in DEMO_SETTINGS.items())
    p = command("demo", "train on built-in synthetic data and print its metrics beside a trivial baseline's",
                "bayesmlc demo --model bmls --n-samples 4000",
                description=f"Train a model on synthetic data ({DEMO_FEATURES} binary features, {DEMO_LABELS} labels, "
                            "a quarter of the rows held out) and print its test metrics beside those of "
                            "ranking every row's labels by their training frequency. The demo's "
                            f"settings, which --set overrides: {settings}.")
    p.add_argument("--model", default="mlgpf", choices=_model_names(), metavar="NAME",
                   help=_models_help("model to train (default mlgpf; logistic is the baseline)"))
    p.add_argument("--n-samples", type=positive_int, default=2000, metavar="N",
                   help=f"rows of synthetic data, a quarter of them for testing (default 2000, at least {DEMO_MIN_SAMPLES})")
    _add_common(p, data=False)
    p.set_defaults(func=cmd_demo)


def _add_topics(command) -> None:
    p = command("topics", "top labels and features per BMLS topic", "bayesmlc topics --model-dir runs/bmls --n-top 10")
    p.add_argument("--model-dir", required=True, metavar="DIR",
                   help="folder written by 'train --model bmls --out' (required)")
    p.add_argument("--n-top", type=positive_int, default=5, metavar="N", help="labels and features per topic (default 5)")
    _add_allow_native(p)
    p.set_defaults(func=cmd_topics)


def _add_plot_history(command) -> None:
    p = command("plot-history", "plot a model's training history to PNG",
                "bayesmlc plot-history --model-dir runs/mlgpf --output mlgpf-history.png")
    p.add_argument("--model-dir", required=True, metavar="DIR", help="folder written by 'train --out' (required)")
    p.add_argument("--output", metavar="PNG", help="PNG path (default DIR/history.png)")
    p.set_defaults(func=cmd_plot_history)


def _add_bench(command) -> None:
    try:
        from ..bench.cli import add_arguments
    except ImportError:
        return
    p = command("bench", "run a benchmark suite and write a report with plots",
                "bayesmlc bench --suite quick --out runs/bench-quick")
    add_arguments(p)
    p.set_defaults(func=cmd_bench)


# ---- argument types ------------------------------------------------------------------------------
def _propensity(text: str) -> tuple[float, float]:
    """``"A,B"`` (both positive, as :func:`bayesmlc.metrics.inverse_propensity` takes them) or a
    registered data set's name, to the constants (A, B)."""
    from ..evaluation import propensity_constants
    from ..exceptions import ValidationError

    first, comma, second = text.partition(",")
    if not comma:
        try:
            return propensity_constants(text)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is neither A,B nor a registered data set ({exc})") from None
    try:
        a, b = float(first), float(second)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: A and B must be numbers") from None
    if not (0 < a < float("inf") and 0 < b < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r}: A and B must be positive finite numbers")
    return a, b
