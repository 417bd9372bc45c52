"""MLGPF's training: the :class:`Trainer` (schedule, batching, the step, divergence, history,
validation, early stopping, checkpoints, progress bar) and the small pure pieces it is made of.

The trainer maximises the doubly stochastic bound of :mod:`bayesmlc.gp.objective`
(:class:`~bayesmlc.gp.objective.VariationalELBO`) with Adam on minibatches of rows (journal paper
sec. 4.2); under data parallelism every process runs it on its rows of each global minibatch
(:mod:`bayesmlc.distributed`).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp
import torch

from ..distributed import ONE_PROCESS, ParallelContext
from ..exceptions import ModelFormatError, ValidationError
from .checkpoints import load_checkpoint, module_from_checkpoint, optimizer_state_from_checkpoint, save_checkpoint
from .history import new_history, new_step_history
from .initialisation import ProjectionCache, feature_batch, initial_module, training_projection
from .likelihoods import BernoulliLogit
from .linear_term import evidence_update
from .objective import (
    LabelEntries, StageClock, VariationalELBO, resolve_negative_samples, sample_label_entries, sample_shared_negatives,
)
from .prediction import mean_utilities

__all__ = [
    "Trainer",
    "TrainingRows",
    "minibatch_targets",
    "TrainingDivergedError",
    "epoch_batches",
    "resolve_batch_size",
    "batch_size_at",
    "make_optimizer",
    "learning_rate_factor",
    "step_progress",
    "all_finite",
    "early_stop",
    "save_checkpoint",
    "load_checkpoint",
    "optimizer_state_from_checkpoint",
]

class TrainingDivergedError(FloatingPointError):
    """The bound or its gradient became NaN or infinite; the model keeps the last good parameters."""


def epoch_batches(n_rows: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch: a fresh random permutation of ``range(n_rows)`` cut into batches (last may be short).

    Per-epoch permutations (not the reference code's shuffle-after-repeat) so every row is seen once
    per epoch.
    """
    order = rng.permutation(n_rows)
    return [np.sort(order[start : start + batch_size]) for start in range(0, n_rows, batch_size)]


#: ``batch_size="auto"``: rows per batch at most, steps per epoch at least, rows per batch at least.
AUTO_BATCH_ROWS, AUTO_MIN_STEPS, AUTO_MIN_ROWS = 500, 8, 32


def resolve_batch_size(batch_size, n_rows: int) -> int:
    """The starting batch size: ``batch_size`` itself, or for ``"auto"``
    ``min(500, max(32, ceil(n_rows / 8)))``.

    "auto" keeps the batch of 500 that the Bibtex measurements used (4,880 rows: 10 steps an epoch)
    and shrinks it on smaller sets so that an epoch still takes at least 8 Adam steps: with 500 rows
    a batch a 333-row set gets one step per epoch, and 50 epochs leave the model far from converged
    (docs/mlgpf.md, "Small and dense data sets").
    """
    if batch_size == "auto":
        return min(AUTO_BATCH_ROWS, max(AUTO_MIN_ROWS, math.ceil(n_rows / AUTO_MIN_STEPS)))
    return int(batch_size)


def batch_size_at(epoch: int, batch_size: int, growth: int, every: int, max_batch_size: int | None) -> int:
    """Batch size in 0-based ``epoch``: ``batch_size + growth * (epoch // every)``, capped.

    The authors' code grows the batch by 20 every 10 epochs (reference notes, sec. 1.8).
    """
    size = batch_size + (growth * (epoch // every) if growth and every else 0)
    return size if max_batch_size is None else min(size, max(max_batch_size, batch_size))


def make_optimizer(module: torch.nn.Module, learning_rate: float, variational_learning_rate: float | None):
    """Adam over all trainable parameters; those of ``module.variational`` and the factor loadings may
    get their own learning rate (the notes found a higher one for variational parameters helps).

    PyTorch's fused Adam (one kernel over each parameter) on the CPU and CUDA: at the default
    module's parameter shapes for L = 3,993 a step took 0.3 ms against 2.7 ms for the loop over
    tensors (one thread), 7% of a default step at the EURLex-4K shape."""
    variational_names = {f"variational.{name}" for name, _ in module.variational.named_parameters()}
    variational, others = [], []
    for name, param in module.named_parameters():
        if param.requires_grad:
            (variational if name in variational_names else others).append(param)
    rate = learning_rate if variational_learning_rate is None else variational_learning_rate
    fused = all(param.device.type in ("cpu", "cuda") for param in others + variational)
    return torch.optim.Adam(
        [{"params": others, "lr": learning_rate}, {"params": variational, "lr": rate}], fused=fused
    )


def step_progress(epoch: int, step: int, steps_in_epoch: int, epochs: int) -> float:
    """Fraction of training done before 0-based ``step`` of 0-based ``epoch``:
    ``(epoch + step / steps_in_epoch) / epochs``, in [0, 1)."""
    return (epoch + step / steps_in_epoch) / epochs


def learning_rate_factor(progress: float, decay_fraction: float) -> float:
    """Multiplier of the base learning rate at training ``progress`` in [0, 1]: a constant rate, then
    a cosine decay to zero over the last ``decay_fraction`` of training.

    factor = 1                               for progress <= 1 - decay_fraction,
    factor = (1 + cos(pi t)) / 2,  t = (progress - (1 - decay_fraction)) / decay_fraction, otherwise.

    ``decay_fraction = 0`` keeps the rate constant. Stochastic-gradient Adam keeps the iterate
    bouncing around the optimum at a constant rate (test P@1 moved by about 1 point between
    evaluations on Bibtex); shrinking the step at the end settles it.
    """
    if decay_fraction <= 0.0 or progress <= 1.0 - decay_fraction:
        return 1.0
    t = min(1.0, (progress - (1.0 - decay_fraction)) / decay_fraction)
    return 0.5 * (1.0 + math.cos(math.pi * t))


def all_finite(loss: torch.Tensor, parameters) -> bool:
    """True when the loss and every gradient are finite: one sum over all of them, which is NaN or
    infinite when any entry is (or when they are so large that the sum overflows, which is divergence
    too), so that each gradient is read once."""
    sums = [loss.detach().sum().double()] + [p.grad.sum().double() for p in parameters if p.grad is not None]
    return bool(torch.isfinite(torch.stack(sums).sum()))


def early_stop(scores: list[float], patience: int) -> bool:
    """True when the best of ``scores`` (higher is better; NaN = not evaluated) is more than
    ``patience`` evaluations old."""
    evaluated = [s for s in scores if not math.isnan(s)]
    if len(evaluated) <= patience:
        return False
    best = int(np.argmax(evaluated))
    return len(evaluated) - 1 - best >= patience


# ---- the trainer ------------------------------------------------------------------------------------
#: The running training P@1 scores the first TRAIN_SCORE_ENTRIES x (steps in the epoch) // L rows of
#: the epoch's first batch, so that it costs no more than a 2^17-entry product per step: at 2^20
#: entries a step and P = 100 that product was larger than a step's own B x S utility moments. Once
#: an epoch, not every step, because the linear term's utilities cost L x K whatever the rows: scoring
#: 32 rows every step took 12% of a default fit's CPU at the EURLex-4K shape x0.25.
TRAIN_SCORE_ENTRIES = 1 << 17
#: ``linear_prior_variance="evidence"``: s2 is updated this many times, evenly over the epochs before
#: the learning rate starts to decay, from the utilities of at most ``EVIDENCE_ROWS`` training rows.
EVIDENCE_UPDATES, EVIDENCE_ROWS = 5, 2000


def evidence_epochs(epochs: int, lr_decay: float) -> set:
    """The 1-based epochs after which ``linear_prior_variance="evidence"`` updates s2: ``EVIDENCE_UPDATES``
    of them, evenly spaced up to the last epoch at the constant rate (none when there is none)."""
    constant = int((1.0 - lr_decay) * epochs)
    return {round(constant * k / EVIDENCE_UPDATES) for k in range(1, EVIDENCE_UPDATES + 1)} - {0}


#: Validation rows are scored this many at a time.
VALIDATION_CHUNK_ROWS = 2048
#: Settings a resumed run may change: they do not alter the path of the parameters.
RESUMABLE_SETTINGS = frozenset({
    "epochs", "verbose", "checkpoint_every", "checkpoint_path", "n_threads", "device", "early_stopping_patience",
    "validation_every", "rank_by",
})


def skip_negative_draws(n_negatives: np.ndarray, negative_samples: int, rng: np.random.Generator) -> None:
    """Advance ``rng`` as :func:`~bayesmlc.gp.objective.sample_label_entries` does for rows with
    ``n_negatives`` negatives (one draw of ``negative_samples`` of them without replacement per row
    that has more), without their labels: the draws for rows another data-parallel process holds."""
    for count in n_negatives:
        if count > negative_samples:
            rng.choice(int(count), negative_samples, replace=False)


def minibatch_targets(Y, label_mask, rows, rng: np.random.Generator, device, dtype, negative_samples="auto",
                      negative_sampling: str = "batch", share: slice | None = None, n_batch: int | None = None,
                      strategy=ONE_PROCESS):
    """The label targets of the rows ``rows`` of ``Y`` for :func:`~bayesmlc.gp.objective.minibatch_elbo`,
    and those rows of ``Y`` (CSR): ``("full", Y dense, mask dense or None)`` when every label enters
    the bound (``negative_samples`` resolved by :func:`~bayesmlc.gp.objective.resolve_negative_samples`),
    ``("sampled", LabelEntries)`` for ``negative_sampling="row"``, ``("shared", SharedNegatives)`` for
    ``"batch"``.

    Under data parallelism ``rows`` are this process's rows of a global batch of ``n_batch`` rows
    (None: ``len(rows)``), at the positions ``share`` of it (None: all of them), and ``strategy``
    sums over processes: the random stream advances as in one process holding the whole batch.
    """
    Y_rows = Y[rows]
    mask_rows = None if label_mask is None else label_mask[rows]
    negative_samples = resolve_negative_samples(negative_samples, Y.shape[1])
    if negative_samples is None:
        Y_dense = torch.as_tensor(Y_rows.toarray(), device=device, dtype=dtype)
        mask_dense = None if mask_rows is None else torch.as_tensor(mask_rows.toarray(), device=device, dtype=dtype)
        return ("full", Y_dense, mask_dense), Y_rows
    if negative_sampling == "batch":
        # one draw per global batch: every data-parallel process draws the same labels
        return ("shared", sample_shared_negatives(Y_rows, mask_rows, negative_samples, rng)), Y_rows
    share = slice(0, len(rows)) if share is None else share
    # Negatives are drawn for the whole global batch in row order, so that every data-parallel
    # process consumes the random stream of one process. The other processes' rows only advance
    # it, which needs just their numbers of negatives (summed over processes).
    n_negatives = np.zeros(len(rows) if n_batch is None else n_batch)
    observed = np.full(len(rows), Y.shape[1]) if mask_rows is None else np.diff(mask_rows.indptr)
    n_negatives[share] = observed - np.diff(Y_rows.indptr)  # Y is zero where the mask is
    n_negatives = strategy.reduce_sum(n_negatives)
    skip_negative_draws(n_negatives[: share.start], negative_samples, rng)
    if len(rows):
        entries = sample_label_entries(Y_rows, mask_rows, negative_samples, rng)
    else:  # a process may hold no row of a batch
        entries = LabelEntries(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
    skip_negative_draws(n_negatives[share.stop :], negative_samples, rng)
    return ("sampled", entries), Y_rows


@dataclass
class TrainingRows:
    """This process's prepared training rows and their place among all training rows.

    X : CSR (n, D); Y : CSR (n, L) 0/1; label_mask : CSR (n, L) 0/1 or None (all observed);
    projection : the rows' :class:`~bayesmlc.gp.initialisation.ProjectionCache` or None
    (:func:`~bayesmlc.gp.initialisation.training_projection`); context : ParallelContext of the
    rows (None: one process holding them all).
    """

    X: sp.csr_matrix
    Y: sp.csr_matrix
    label_mask: sp.csr_matrix | None = None
    projection: ProjectionCache | None = None
    context: ParallelContext | None = None

    def __post_init__(self):
        if self.context is None:
            self.context = ParallelContext.whole(self.X.shape[0])


@dataclass
class StepResult:
    """What one :meth:`Trainer.step` computed: this process's ``estimate`` (a
    :class:`~bayesmlc.gp.objective.BoundEstimate`), ``value`` (the estimate summed over processes),
    and the batch's rows here: ``rows`` (local indices), ``share`` (their positions in the global
    batch), ``Y_rows`` (their labels, CSR)."""

    estimate: object
    value: float
    rows: np.ndarray
    share: slice
    Y_rows: sp.csr_matrix


class Trainer:
    """Doubly stochastic variational training of an :class:`~bayesmlc.gp.objective.MLGPFModule`.

    :meth:`fit` is ``MLGPF.fit``'s loop: a validation split, the data-driven start (or a
    checkpoint's state), then epochs of Adam steps on the bound with a learning-rate schedule and
    growing batches, recording history, scoring the validation rows, stopping early, writing
    checkpoints and showing a progress bar. :meth:`stream_pass` is one pass of ``partial_fit``;
    :meth:`step` one optimiser step, the piece both are made of (and that the benchmarks time).

    Parameters
    ----------
    settings : dict, the estimator's parameters (``MLGPF.get_params()``); read as attributes of
        :attr:`settings`, which a caller may replace between passes (a stream's annealed rate).
    rng : numpy Generator, the one random stream: validation split, initialisation, batches,
        negative samples, in that order.
    device, dtype : where and in which precision the module trains.
    module : the module to train (None: :meth:`initialise` or :meth:`fit` builds it); a fresh Adam
        optimiser is made for it.
    jitter : float or None, the relative jitter to start from (None: ``settings["jitter"]``); it
        only grows (:attr:`jitter`).

    Attributes
    ----------
    module, optimizer, jitter, history (per epoch, as ``MLGPF.history_``), steps (per step:
    ``step``, ``wall_time``, ``elbo``).
    """

    def __init__(self, settings: dict, rng: np.random.Generator, device="cpu", dtype=torch.float32, module=None,
                 jitter: float | None = None):
        self.settings = SimpleNamespace(**settings)
        self.rng = rng
        self.device, self.dtype = device, dtype
        self.jitter = self.settings.jitter if jitter is None else float(jitter)
        self.history, self.steps = new_history(), new_step_history()
        self.module = self.optimizer = None
        self._start_clock, self._elapsed_before = time.perf_counter(), 0.0
        self._rate_factor = 1.0  # the schedule's factor of the linear term's rate (the others' is in Adam's groups)
        if module is not None:
            self.start(module)

    # ---- set-up -------------------------------------------------------------------------------
    def start(self, module) -> None:
        """Train ``module`` from here on, with a fresh Adam optimiser (:func:`make_optimizer`)."""
        self.module = module
        self.optimizer = make_optimizer(module, self.settings.learning_rate, self.settings.variational_learning_rate)
        self._trained = [p for p in module.parameters() if p.requires_grad]

    def initialise(self, X, Y, context: ParallelContext | None = None) -> np.ndarray | None:
        """Build the starting module from the prepared training rows ``X``, ``Y`` (this process's share
        of ``context``'s rows) as ``fit`` does (:func:`~bayesmlc.gp.initialisation.initial_module`)
        and start training it. Returns the rows' projection cache (or None)."""
        module, projection = initial_module(self.settings, X, Y, self.rng, context, self.device, self.dtype)
        self.start(module)
        return projection

    # ---- one step -----------------------------------------------------------------------------
    def step(self, data: TrainingRows, batch_rows: np.ndarray, elbo: VariationalELBO, timings: dict | None = None,
             label: str = "MLGPF", at: str = "") -> StepResult:
        """One Adam step on the global minibatch ``batch_rows`` (sorted ids of ``data.context``'s rows),
        of which this process computes the rows it holds; the gradients are summed over processes.

        ``timings``: seconds per stage are added to it ("batching", the stages of
        :func:`~bayesmlc.gp.objective.minibatch_elbo`, "backward", "adam"). Raises
        :class:`TrainingDivergedError` (``label`` and ``at`` place it) when the bound or a gradient
        is not finite; the parameters are then those before the step.
        """
        clock = StageClock(timings)
        shard, strategy = data.context.shard, data.context.strategy
        share = shard.positions_in(batch_rows)  # the batch's rows this process holds
        rows = batch_rows[share] - shard.start
        batch = feature_batch(self.module, data.X, rows, data.projection)
        targets, Y_rows = minibatch_targets(
            data.Y, data.label_mask, rows, self.rng, self.device, self.dtype, self.settings.negative_samples,
            self.settings.negative_sampling, share, len(batch_rows), strategy,
        )
        linear = None if self.module.linear is None else self.module.linear.block(data.X[rows], targets)
        clock.lap("batching")
        self.optimizer.zero_grad(set_to_none=True)
        estimate = elbo(self.module, batch, targets, self.jitter, len(batch_rows), strategy, timings, linear)
        loss = elbo.loss(estimate)
        clock.restart()
        loss.backward()
        clock.lap("backward")
        linear_gradient = None
        if linear is not None:  # the data term's gradient on the block, plus the prior's estimate
            linear_gradient = self.module.linear.prior_gradient(linear, elbo.num_data)
            if linear.weight.grad is not None:
                linear_gradient += linear.weight.grad
        if not all_finite(loss, self._trained + ([] if linear is None else [linear.weight])):
            raise TrainingDivergedError(
                f"{label}: the bound or its gradient became NaN/inf{at}; training stopped and the parameters "
                "before that step were kept. Try a smaller learning_rate, a larger jitter or dtype='float64'."
            )
        value = strategy.reduce_gradients(self._trained, estimate.elbo.detach())  # sums over processes
        clock.restart()
        self.optimizer.step()
        if linear is not None:
            rate = self.settings.linear_learning_rate
            rate = self.settings.learning_rate if rate is None else rate
            self.module.linear.adam_step(linear, linear_gradient, rate * self._rate_factor)
        clock.lap("adam")
        self.jitter = max(self.jitter, estimate.jitter)  # a jitter that was needed once stays
        return StepResult(estimate, value, rows, share, Y_rows)

    # ---- a stream -----------------------------------------------------------------------------
    def stream_pass(self, X, Y, label_mask, num_data: int) -> float:
        """One pass over the prepared rows ``X``, ``Y`` (``label_mask`` or None) in random minibatches
        of ``settings.batch_size`` rows (``"auto"`` resolved on these rows) at the current
        ``learning_rate`` and ``variational_learning_rate``, on the bound of ``num_data`` rows; the
        first pass of a trainer without a module sets it up from these rows (:meth:`initialise`).
        Returns the mean bound estimate of its steps."""
        projection = self.initialise(X, Y) if self.module is None else training_projection(self.module, X)
        data = TrainingRows(X, Y, label_mask, projection)
        if self.module.linear is not None:
            self.module.linear.set_training_rows(X)
        self._rate_factor = 1.0
        settings = self.settings
        variational_rate = settings.learning_rate if settings.variational_learning_rate is None \
            else settings.variational_learning_rate
        for group, rate in zip(self.optimizer.param_groups, (settings.learning_rate, variational_rate)):
            group["lr"] = rate
        elbo = VariationalELBO(BernoulliLogit(settings.quadrature_points), num_data, settings.kl_weight)
        n_rows = data.X.shape[0]
        batches = epoch_batches(n_rows, resolve_batch_size(settings.batch_size, n_rows), self.rng)
        total = 0.0
        for rows in batches:
            total += self.step(data, rows, elbo, label="MLGPF.partial_fit").value / len(batches)
        return total

    # ---- fit ----------------------------------------------------------------------------------
    def fit(self, X, Y, label_mask=None, context: ParallelContext | None = None, resume: bool = False) -> None:
        """Train on the prepared rows ``X``, ``Y`` (this process's share of ``context``'s rows; row ids
        in the validation split and the batches are global), from the data-driven start, or with
        ``resume`` from ``settings.checkpoint_path``. On return :attr:`module` holds the parameters
        with the best validation P@1 when validation rows are held out, the last ones otherwise."""
        settings = self.settings
        self._start_clock = time.perf_counter()
        context = ParallelContext.whole(X.shape[0]) if context is None else context
        n_all = context.n_total
        n_val = int(round(settings.validation_fraction * n_all))
        order = self.rng.permutation(n_all)
        val_rows, train_rows = np.sort(order[:n_val]), np.sort(order[n_val:])
        checkpoint = self._checkpoint_to_resume(n_all, X.shape[1], Y.shape[1], n_val) if resume else None
        if checkpoint is not None:
            val_rows = np.asarray(checkpoint["val_rows"], dtype=np.int64)
            train_rows = np.setdiff1d(np.arange(n_all), val_rows)
        local_train, train_context = context.select(train_rows)
        local_val, _ = context.select(val_rows)
        X_train, Y_train = X[local_train], Y[local_train]
        if checkpoint is None:
            projection = self.initialise(X_train, Y_train, train_context)
        else:
            self.start(module_from_checkpoint(settings, checkpoint, settings.checkpoint_path, self.device, self.dtype))
            projection = training_projection(self.module, X_train)
        train = TrainingRows(X_train, Y_train, None if label_mask is None else label_mask[local_train], projection,
                             train_context)
        if self.module.linear is not None:
            self.module.linear.set_training_rows(X_train)
        base_rates = [group["lr"] for group in self.optimizer.param_groups]  # before a checkpoint's decayed ones
        start_epoch, best_state = 0, None
        if checkpoint is not None:
            start_epoch, best_state = self._restore(checkpoint)
        validation = (X[local_val], Y[local_val], n_val)
        elbo = VariationalELBO(BernoulliLogit(settings.quadrature_points), train_context.n_total, settings.kl_weight)
        first_batch_size = resolve_batch_size(settings.batch_size, train_context.n_total)
        progress = None
        if settings.verbose:
            from tqdm.auto import tqdm

            progress = tqdm(total=settings.epochs, initial=start_epoch, desc="MLGPF", unit="epoch", leave=False)
        try:
            for epoch in range(start_epoch, settings.epochs):
                batch_size = batch_size_at(epoch, first_batch_size, settings.batch_size_growth,
                                           settings.batch_size_every, settings.max_batch_size)
                self._epoch(train, elbo, epoch, batch_size, base_rates)
                if epoch + 1 in self._evidence_epochs():
                    self.update_prior_variance(train)
                val = [math.nan] * 3
                if n_val and ((epoch + 1) % settings.validation_every == 0 or epoch + 1 == settings.epochs):
                    val = self._validation_scores(*validation, context.strategy)
                for k, value in zip((1, 3, 5), val):
                    self.history[f"val_P@{k}"].append(value)
                if n_val and not math.isnan(val[0]):
                    if val[0] >= max(v for v in self.history["val_P@1"] if not math.isnan(v)):
                        best_state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
                if progress is not None:
                    progress.update(1)
                    progress.set_postfix(self._progress_figures(n_val > 0))
                stop = settings.early_stopping_patience is not None and early_stop(
                    self.history["val_P@1"], settings.early_stopping_patience
                )
                last = epoch + 1 == settings.epochs or stop
                every = settings.checkpoint_every
                if every and context.strategy.is_main and ((epoch + 1) % every == 0 or last):
                    self._save_checkpoint(epoch + 1, n_all, X.shape[1], Y.shape[1], val_rows, best_state)
                if stop:
                    break
        finally:
            if progress is not None:
                progress.close()
        if best_state is not None:  # validation was used: keep the best parameters seen
            self.module.load_state_dict(best_state)

    def _epoch(self, train: TrainingRows, elbo: VariationalELBO, epoch: int, batch_size: int, base_rates) -> None:
        """The steps of 0-based ``epoch``, and its line of :attr:`history` up to validation."""
        settings = self.settings
        epoch_elbo, epoch_kl, max_jitter = 0.0, 0.0, 0.0
        batches = epoch_batches(train.context.n_total, batch_size, self.rng)
        scored_rows = max(1, TRAIN_SCORE_ENTRIES * len(batches) // train.Y.shape[1])
        for batch_index, batch_rows in enumerate(batches):
            factor = learning_rate_factor(step_progress(epoch, batch_index, len(batches), settings.epochs),
                                          settings.lr_decay)
            for group, base in zip(self.optimizer.param_groups, base_rates):
                group["lr"] = base * factor
            self._rate_factor = factor
            step_number = len(self.steps["step"]) + 1
            result = self.step(train, batch_rows, elbo, at=f" at epoch {epoch + 1}, step {step_number}")
            max_jitter = max(max_jitter, result.estimate.jitter)
            self.steps["step"].append(step_number)
            self.steps["wall_time"].append(self._elapsed())
            self.steps["elbo"].append(result.value)
            epoch_elbo += result.value / len(batches)
            epoch_kl += float(result.estimate.kl.detach()) / len(batches)
            if batch_index == 0:
                hits, seen = self._running_hits(train, result, scored_rows)
        hits, seen = train.context.strategy.sum_counts(hits, seen)
        for key, value in (("epoch", epoch + 1), ("wall_time", self._elapsed()), ("objective", epoch_elbo),
                           ("kl", epoch_kl), ("batch_size", batch_size), ("jitter", max_jitter),
                           ("train_P@1", hits / max(seen, 1))):
            self.history[key].append(value)

    def _running_hits(self, train: TrainingRows, result: StepResult, scored_rows: int) -> tuple:
        """(top-1 hits, rows scored) of the running training P@1: the parameters after the step scored on
        the step's first ``scored_rows`` rows (positions in the global batch, whichever process holds
        them)."""
        scored = slice(0, max(0, min(len(result.rows), scored_rows - result.share.start)))
        with torch.no_grad():
            scores = result.estimate.mean_h.detach()[scored] @ self.module.Phi.T + self.module.bias
            if self.module.linear is not None:
                scores += self.module.linear.utilities(train.X[result.rows[scored]])
            top = scores.argmax(1).cpu().numpy().copy()
        return int(result.Y_rows[np.arange(len(top)), top].sum()), len(top)  # sparse result when no row is scored

    def _evidence_epochs(self) -> set:
        if self.module.linear is None or self.settings.linear_prior_variance != "evidence":
            return set()
        return evidence_epochs(self.settings.epochs, self.settings.lr_decay)

    def update_prior_variance(self, train: TrainingRows) -> float:
        """Set the linear term's s2 to MacKay's evidence update
        (:func:`~bayesmlc.gp.linear_term.evidence_update`) from the utilities of ``EVIDENCE_ROWS``
        evenly spaced training rows (all of them when fewer); returns the new s2."""
        n_rows = train.X.shape[0]
        rows = np.unique(np.linspace(0, n_rows - 1, min(n_rows, EVIDENCE_ROWS)).round().astype(np.int64))
        X_rows = train.X[rows]
        f_mean, _ = mean_utilities(self.module, X_rows, self.jitter)
        mask = None if train.label_mask is None else train.label_mask[rows]
        s2, _ = evidence_update(self.module.linear, X_rows, f_mean, mask, n_rows / rows.size)
        if s2 > 0:
            self.module.linear.prior_variance = s2
        return self.module.linear.prior_variance

    def _elapsed(self) -> float:
        return self._elapsed_before + time.perf_counter() - self._start_clock

    def _validation_scores(self, X_val, Y_val, n_val: int, strategy) -> list:
        """P@1, P@3, P@5 over all ``n_val`` validation rows, of which this process holds ``X_val``."""
        from ..metrics import precision_at_k

        sums = np.zeros(3)
        if X_val.shape[0]:
            parts, weights = [], None
            for start in range(0, X_val.shape[0], VALIDATION_CHUNK_ROWS):
                part, weights = mean_utilities(self.module, X_val[start : start + VALIDATION_CHUNK_ROWS], self.jitter,
                                               weights)
                parts.append(part)
            scores = np.vstack(parts)
            sums = np.array([precision_at_k(Y_val, scores, k) * X_val.shape[0] for k in (1, 3, 5)])
        return [float(v) for v in strategy.reduce_sum(sums) / n_val]

    def _progress_figures(self, validating: bool) -> dict:
        """The progress bar's figures: the epoch's ELBO and training P@1, and with validation rows the
        latest validation P@1 (before the first evaluation: none yet)."""
        shown = {"ELBO": f"{self.history['objective'][-1]:.4g}", "train P@1": f"{self.history['train_P@1'][-1]:.3f}"}
        evaluated = [v for v in self.history["val_P@1"] if not math.isnan(v)]
        if validating and evaluated:
            shown["val P@1"] = f"{evaluated[-1]:.3f}"
        return shown

    # ---- checkpoints --------------------------------------------------------------------------
    def _plain_settings(self) -> dict:
        return {k: v for k, v in vars(self.settings).items() if v is None or isinstance(v, (bool, int, float, str))}

    def _checkpoint_to_resume(self, n_rows: int, n_features: int, n_labels: int, n_val: int) -> dict | None:
        """The checkpoint at ``settings.checkpoint_path`` (its fields checked by :func:`load_checkpoint`),
        checked against these settings and data (``n_val`` validation rows of ``n_rows``, an epoch
        within ``epochs``); None (with a warning) when there is none yet."""
        path = self.settings.checkpoint_path
        if not path:
            raise ValidationError("resume=True needs checkpoint_path (the checkpoint to continue from)")
        if not os.path.exists(path):
            warnings.warn(f"{path}: no checkpoint yet; starting from scratch", UserWarning, stacklevel=5)
            return None
        checkpoint = load_checkpoint(path)
        mine = self._plain_settings()
        written = {"negative_sampling": "row", **checkpoint["params"]}  # checkpoints from before the setting
        different = sorted(k for k in mine if k not in RESUMABLE_SETTINGS and written.get(k) != mine[k])
        if self.settings.lr_decay > 0 and checkpoint["params"].get("epochs") != self.settings.epochs:
            different.append("epochs (the learning-rate decay depends on it)")
        if different:
            raise ValidationError(
                f"{path}: checkpoint was written with different parameters ({', '.join(different)}); "
                "resume needs the same model settings"
            )
        if (checkpoint["n_rows"], checkpoint["n_features"], checkpoint["n_labels"]) != (n_rows, n_features, n_labels):
            raise ValidationError(
                f"{path}: checkpoint is for data of shape rows={checkpoint['n_rows']}, "
                f"features={checkpoint['n_features']}, labels={checkpoint['n_labels']}, not "
                f"{n_rows}, {n_features}, {n_labels}"
            )
        if checkpoint["epoch"] > self.settings.epochs:
            raise ValidationError(f"{path}: checkpoint is at epoch {checkpoint['epoch']}, beyond epochs="
                                  f"{self.settings.epochs}; resume with at least that many epochs")
        if len(checkpoint["val_rows"]) != n_val:
            raise ModelFormatError(f"{path}: checkpoint field val_rows holds {len(checkpoint['val_rows'])} rows, "
                                   f"validation_fraction={self.settings.validation_fraction} of {n_rows} makes {n_val}")
        return checkpoint

    def _restore(self, checkpoint: dict):
        """Optimizer, random stream, history, jitter and clock from ``checkpoint``; returns (the epoch
        to start at, the best validated parameters or None)."""
        self.optimizer.load_state_dict(
            optimizer_state_from_checkpoint(self.optimizer, checkpoint["optimizer"], self.settings.checkpoint_path))
        self.rng.bit_generator.state = checkpoint["rng_state"]
        self.history = {k: list(v) for k, v in checkpoint["history"].items()}
        self.steps = {k: list(v) for k, v in checkpoint["steps"].items()}
        self.jitter = float(checkpoint["jitter"])
        self._elapsed_before = float(checkpoint["elapsed"])
        best_state = None
        if checkpoint.get("best_state") is not None:
            best_state = {k: torch.as_tensor(v) for k, v in checkpoint["best_state"].items()}
        return int(checkpoint["epoch"]), best_state

    def _save_checkpoint(self, epoch: int, n_rows: int, n_features: int, n_labels: int, val_rows, best_state) -> None:
        save_checkpoint(
            self.settings.checkpoint_path,
            {
                "params": self._plain_settings(),
                "n_features": n_features,
                "n_labels": n_labels,
                "n_rows": n_rows,
                "epoch": epoch,
                "parameters": {k: v.detach().cpu() for k, v in self.module.state_dict().items()},
                "optimizer": self.optimizer.state_dict(),
                "rng_state": self.rng.bit_generator.state,
                "history": self.history,
                "steps": self.steps,
                "jitter": self.jitter,
                "val_rows": val_rows,
                "elapsed": self._elapsed(),
                "best_state": None if best_state is None else {k: v.cpu() for k, v in best_state.items()},
            },
        )
