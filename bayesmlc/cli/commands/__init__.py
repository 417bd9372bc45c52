"""The commands of ``bayesmlc``, one module per command or group of commands; each ``cmd_NAME(args)``
takes the parsed arguments and returns the exit code."""

from .demo import cmd_demo
from .evaluate import cmd_evaluate
from .predict import cmd_predict
from .summaries import cmd_bench, cmd_info, cmd_plot_history, cmd_topics
from .train import cmd_train

__all__ = ["cmd_bench", "cmd_demo", "cmd_evaluate", "cmd_info", "cmd_plot_history", "cmd_predict", "cmd_topics",
           "cmd_train"]
