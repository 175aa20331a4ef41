"""The N reconstruction problems of one engine call, and the simulator of what each victim shared.

:class:`ProblemSet` stacks N compatible problems (same architecture, batch size and update protocol)
into tensors with a leading problem dimension. :class:`UpdateSimulator` computes every problem's
dummy update ``U(theta, x, y)``: the gradient ``grad_theta L(theta; x, y)`` (FedSGD) or the model
difference ``theta_0 - theta_K`` after ``K = local_steps`` SGD steps with ``local_lr`` on the same
batch (FedAvg; the attacker unrolls the steps functionally, as Geiping et al. 2020, Sec. 5, do for
multi-step updates). It runs either vectorised or as the reference Python loop with
``torch.autograd.grad(..., create_graph=True)`` per row. Vectorised, models whose convolutions are
all small (LeNet) run one ``torch.func.vmap`` of the forward pass (:func:`leakgym.models.task_loss`)
over rows that each own their parameters, then one ``torch.autograd.grad(..., create_graph=True)``
of the summed losses, which is every row's own gradient; other models run one ``vmap`` over
``torch.func.grad`` (parameters shared, ``in_dims=None``, when all problems attack the same model,
stacked otherwise). Both are the vmap form of :mod:`leakgym.models.parameter_sets`
(:func:`~leakgym.models.parameter_sets.vmapped`): small convolutions run as unfold + matrix product
there (:mod:`leakgym.models.convolution`), because ``vmap`` makes them grouped convolutions, whose
double backward loops over the rows. A plain layer stack (DLG's LeNet) skips vmap: its rows' losses are
:func:`~leakgym.models.parameter_sets.batched_loss` in its row-wise form (:mod:`leakgym.models.rowwise`).
On a CPU, a model too large for ``vmap(grad)`` to pay (:func:`~leakgym.models.parameter_sets.vmap_pays_off`:
ResNet-18) has its rows computed by the loop, one after another (:meth:`UpdateSimulator.updates`); the
rest of the engine (matching, image steps) stays one computation over all rows.

BatchNorm: clients compute updates in train mode, so for batches of more than one example BN
normalises with the batch's own statistics. The engine works on a private copy of the model whose
BN layers have no running statistics (``torch.func.replace_all_batch_norm_modules_``), so BN always
uses batch statistics and ``vmap`` never meets an in-place running-stat update. Batches of one
example are computed with BN in eval mode (running statistics), mirroring
:func:`leakgym.models.bn_eval_if_single` on the client. GradInversion's BN prior needs the dummy
batch's BN-input statistics: forward pre-hooks record them as outputs of the (vmapped) function.

Stochastic models: PRECODE's bottleneck samples ``z = mu + sigma * eps`` (PPP paper Eq. 2) with
``torch.randn_like``, i.e. from torch's global RNG, which no per-problem generator can reach. In the
engine's private copy every sampling bottleneck instead takes ``eps`` from an input of the simulated
update, drawn by the caller from each problem's own generator (one fresh ``eps`` per forward pass,
``local_steps`` of them for FedAvg), so the noise of problem ``i`` does not depend on its neighbours
and the vectorised and sequential paths see the same noise. Any other random operation in a model's
forward would draw from the global RNG; the vectorised path rejects it (``vmap(randomness="error")``), and
so does the CPU's row-by-row form of large models (it watches the CPU generator's state).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn
from torch.func import grad

from leakgym.attacks.base import AttackerKnowledge
from leakgym.fl.bank import ModelBank
from leakgym.fl.update import SharedUpdate
from leakgym.models import BatchNormInputStatistics, task_loss
from leakgym.models.convolution import UNFOLD_MAX_ENTRIES, unfolded_entries
from leakgym.models.parameter_sets import batched_loss, vmap_pays_off, vmapped
from leakgym.models.precode import VariationalBottleneck
from leakgym.models.rowwise import RowwiseForward


def _bn_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _stacked_states(models: Sequence[nn.Module], param_names: list[str], state_names: list[str]) -> dict[str, Tensor]:
    """``name -> (N, *shape)``: the models' parameters and buffers (``state_names``), stacked and detached; the
    parameters of a vector's games are read from their :class:`~leakgym.fl.bank.ModelBank` (one copy per
    name, not a stack of N)."""
    banked = ModelBank.of(models)
    out = {} if banked is None else banked[0].gather(banked[1], param_names)
    rest = [n for n in state_names if n not in out]
    if rest:
        states = [{**dict(m.named_parameters()), **dict(m.named_buffers())} for m in models]
        for n in rest:
            if len({tuple(s[n].shape) for s in states}) != 1:
                raise ValueError("problems of one ProblemSet must share the architecture")
            out[n] = torch.stack([s[n].detach() for s in states])
    return out


@dataclass
class ProblemSet:
    """N reconstruction problems that share an architecture, batch size and update protocol.

    Build with :meth:`from_updates`. Tensors with a leading problem dimension have size N; the
    engine broadcasts them over restarts.
    """

    model: nn.Module
    """Private working copy of the architecture (BN without running stats for batches > 1)."""
    free: dict[str, Tensor]
    """Parameters differentiated by the simulated update: ``(N, ...)`` if ``batched`` else shared."""
    fixed: dict[str, Tensor]
    """Remaining parameters and buffers, same layout as ``free``."""
    batched: bool
    """Whether parameters differ between problems (stacked) or are shared."""
    targets: dict[str, Tensor]
    """Victim updates of the matched layers, ``name -> (N, *shape)``."""
    labels: Tensor | None
    """Known/inferred labels ``int64 (N, B)``, or None to optimise soft labels jointly (DLG)."""
    kind: str
    local_steps: int
    local_lr: Tensor
    """``(N,)`` local learning rates (FedAvg)."""
    batch_size: int
    image_shape: tuple[int, int, int]
    num_classes: int
    lower: Tensor
    upper: Tensor
    """Box constraint: per-channel bounds of valid normalised images, shape ``(C, 1, 1)``."""
    bn_targets: list[tuple[Tensor, Tensor]] | None = None
    """Per BN layer, victim batch ``(mean, var)`` stacked over problems: ``(N, C_l)`` each."""

    @property
    def n(self) -> int:
        return next(iter(self.targets.values())).shape[0]

    @property
    def device(self) -> torch.device:
        return self.lower.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lower.dtype

    @classmethod
    def from_updates(
        cls,
        updates: Sequence[SharedUpdate],
        knowledges: Sequence[AttackerKnowledge],
        *,
        names: Sequence[str],
        labels: Tensor | None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        use_bn_stats: bool = False,
    ) -> ProblemSet:
        """Stack N compatible problems.

        Args:
            updates, knowledges: one per problem; same architecture, batch size, update kind and
                local step count (callers group problems by these).
            names: parameter names whose updates are matched (a subset of the update's tensors).
            labels: ``int64 (N, B)`` labels, or None to optimise soft labels.
            use_bn_stats: record BN statistics of the dummy batch and take the victim's from
                ``knowledge.bn_stats`` (GradInversion's BN prior).
        """
        if not updates or len(updates) != len(knowledges):
            raise ValueError(f"need matching, non-empty updates ({len(updates)}) and knowledges ({len(knowledges)})")
        device = torch.device(device)
        k0, u0 = knowledges[0], updates[0]
        b = k0.batch_size
        for u, k in zip(updates, knowledges):
            if k.batch_size != b or u.kind != u0.kind or u.local_steps != u0.local_steps:
                raise ValueError("problems of one ProblemSet must share batch_size, update kind and local_steps")
            if u.batch_size != k.batch_size:
                raise ValueError(
                    f"update.batch_size={u.batch_size} differs from knowledge.batch_size={k.batch_size}"
                )
        if u0.kind == "model_delta" and u0.local_steps < 1:
            raise ValueError(f"local_steps={u0.local_steps}; must be >= 1")
        names = list(names)
        if not names:
            raise ValueError("no layers to match; select at least one parameter name")
        param_names = [n for n, _ in k0.model.named_parameters()]
        unknown = [n for n in names if n not in param_names]
        if unknown:
            raise ValueError(f"matched names {unknown} are not parameters of the model; allowed: {param_names}")
        wanted = set(names)
        for u in updates:
            if not u.tensors.keys() >= wanted:
                missing = [n for n in names if n not in u.tensors]
                raise ValueError(f"update lacks matched tensors {missing}")

        model = copy.deepcopy(k0.model).to(device=device, dtype=dtype)
        model.train()
        if b > 1:
            torch.func.replace_all_batch_norm_modules_(model)
        else:
            for m in _bn_modules(model):
                m.eval()
        for p in model.parameters():
            p.requires_grad_(False)

        # Shared parameters when every problem attacks the same model (the common case).
        models = [k.model for k in knowledges]
        state_names = param_names + [n for n, _ in model.named_buffers()]

        def state(m: nn.Module) -> dict[str, Tensor]:
            sd = dict(m.named_parameters())
            sd.update(dict(m.named_buffers()))
            return {n: sd[n].detach() for n in state_names}

        s0 = state(models[0])
        batched = False
        if any(m is not models[0] for m in models[1:]):
            stacked = _stacked_states(models, param_names, state_names)
            # Per-problem parameters unless every model holds the same values (one comparison per name,
            # one host sync in all); decided by the first name alone when it already differs (the games of
            # a vector step: a small fraction of the comparisons, one sync; two syncs when all agree).
            first = next(iter(stacked.values()))
            batched = not bool((first == first[:1]).all()) or \
                not bool(torch.stack([(t == t[:1]).all() for t in stacked.values()]).all())

        def cast(t: Tensor) -> Tensor:
            return t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device=device)

        if batched:
            full = {n: cast(stacked[n]) for n in state_names}
        else:
            full = {n: cast(s0[n]) for n in state_names}
        if u0.kind == "gradient":
            free_names = names
        else:
            free_names = param_names  # every parameter moves during the simulated local steps
        free = {n: full[n] for n in free_names}
        fixed = {n: full[n] for n in state_names if n not in free}

        with torch.no_grad():  # the victims' updates, detached (without a detach per update and layer)
            targets = {n: torch.stack([u.tensors[n] for u in updates]).to(device=device, dtype=dtype)
                       for n in names}
        local_lr = torch.tensor([float(u.local_lr) for u in updates], device=device, dtype=dtype)
        if u0.kind == "model_delta" and not bool((local_lr > 0).all()):
            raise ValueError(f"model_delta updates need local_lr > 0; got {local_lr.tolist()}")
        spec = k0.spec
        lower, upper = spec.unit_bounds(torch.zeros(1, spec.channels, 1, 1, device=device, dtype=dtype))
        bn_targets = None
        if use_bn_stats:
            n_bn = len(_bn_modules(model))
            if n_bn == 0:
                raise ValueError("the BN-statistics prior needs a model with BatchNorm layers")
            if any(k.bn_stats is None for k in knowledges):
                raise ValueError("the BN-statistics prior needs knowledge.bn_stats for every problem")
            if any(len(k.bn_stats) != n_bn for k in knowledges):
                raise ValueError(f"knowledge.bn_stats must list {n_bn} (mean, var) pairs, one per BN layer")
            bn_targets = [
                (torch.stack([k.bn_stats[i][0] for k in knowledges]).to(device=device, dtype=dtype),
                 torch.stack([k.bn_stats[i][1] for k in knowledges]).to(device=device, dtype=dtype))
                for i in range(n_bn)
            ]
        if labels is not None:
            labels = labels.to(device=device, dtype=torch.int64)
            if labels.shape != (len(updates), b):
                raise ValueError(f"labels must have shape ({len(updates)}, {b}); got {tuple(labels.shape)}")
        return cls(
            model=model, free=free, fixed=fixed, batched=batched, targets=targets, labels=labels,
            kind=u0.kind, local_steps=int(u0.local_steps), local_lr=local_lr, batch_size=b,
            image_shape=tuple(spec.shape), num_classes=spec.num_classes,
            lower=lower.reshape(-1, 1, 1), upper=upper.reshape(-1, 1, 1), bn_targets=bn_targets,
        )

    def subset(self, index: int) -> ProblemSet:
        """Problem ``index`` alone, as a set of one problem."""
        pick = (lambda t: t[index:index + 1]) if self.batched else (lambda t: t)
        return dataclasses.replace(
            self,
            free={n: pick(t) for n, t in self.free.items()},
            fixed={n: pick(t) for n, t in self.fixed.items()},
            targets={n: t[index:index + 1] for n, t in self.targets.items()},
            labels=None if self.labels is None else self.labels[index:index + 1],
            local_lr=self.local_lr[index:index + 1],
            bn_targets=None if self.bn_targets is None else [
                (m[index:index + 1], v[index:index + 1]) for m, v in self.bn_targets],
        )


class _BottleneckNoise:
    """Makes the sampling PRECODE bottlenecks of the engine's model copy read ``eps`` from a flat input.

    Each sampling bottleneck's ``forward`` is replaced, on the private copy only, by the same
    computation as :meth:`VariationalBottleneck.forward` (PPP Eq. 2: ``z = mu + sigma * eps``, decoder,
    KL term) with ``eps`` taken from the next ``B * K`` entries of the per-problem vector given to
    :meth:`start`. :attr:`numel` entries are consumed per simulated update.
    """

    def __init__(self, model: nn.Module, batch_size: int, forwards: int) -> None:
        self.modules = [m for m in model.modules()
                        if isinstance(m, VariationalBottleneck) and (m.training or m.sample_in_eval)]
        self.numel = forwards * batch_size * sum(m.latent_dim for m in self.modules)
        self._flat: Tensor | None = None
        self._offset = 0
        for m in self.modules:
            m.forward = self._forward_of(m)

    def _forward_of(self, module: VariationalBottleneck):
        def forward(h: Tensor) -> tuple[Tensor, Tensor]:
            mu, sigma = module.encode(h)
            return module.decoder(mu + sigma * self._take(sigma)), module.kl_divergence(mu, sigma)

        return forward

    def _take(self, like: Tensor) -> Tensor:
        if self._flat is None:
            raise RuntimeError("bottleneck noise requested outside a simulated update")
        size = like.numel()
        if self._offset + size > self.numel:
            raise ValueError(
                f"the model samples its PRECODE bottleneck(s) more often than once per forward pass "
                f"({self._offset + size} noise entries requested, {self.numel} drawn)"
            )
        eps = self._flat[self._offset:self._offset + size].reshape(like.shape)
        self._offset += size
        return eps

    def start(self, flat: Tensor) -> None:
        self._flat, self._offset = flat, 0

    def stop(self) -> None:
        self._flat = None

    def close(self) -> None:
        for m in self.modules:
            del m.forward  # the class's own forward again


def _small_convolutions(ps: ProblemSet, noise: _BottleneckNoise) -> bool:
    """Whether every convolution of ``ps``'s model takes :mod:`leakgym.models.convolution`'s unfolded form at
    its batch size (one forward pass on zeros, recording each layer's input; ``noise``: the model copy's
    bottlenecks, fed zeros); no convolution: True."""
    sizes: list[int] = []
    convs = [m for m in ps.model.modules() if isinstance(m, nn.Conv2d)]
    hooks = [m.register_forward_pre_hook(lambda m, inp: sizes.append(unfolded_entries(m, inp[0]))) for m in convs]
    first = (lambda t: t[0]) if ps.batched else (lambda t: t)
    try:
        with torch.no_grad():
            x = torch.zeros(ps.batch_size, *ps.image_shape, device=ps.device, dtype=ps.dtype)
            y = torch.zeros(ps.batch_size, dtype=torch.int64, device=ps.device)
            noise.start(x.new_zeros(noise.numel))
            try:
                task_loss(ps.model, x, y, params={n: first(t) for n, t in {**ps.fixed, **ps.free}.items()})
            finally:
                noise.stop()
    finally:
        for h in hooks:
            h.remove()
    return all(size <= UNFOLD_MAX_ENTRIES for size in sizes)


def simulates_whole_updates(problems: ProblemSet) -> bool:
    """Whether :class:`UpdateSimulator` computes these problems' dummy updates as ``vmap(grad)`` of whole
    updates: the form of models whose convolutions are too large for the unfolded form at this batch size
    (the CIFAR ConvNet, ResNet-18), rather than per-row leaves (DLG's LeNet on digits)."""
    forwards = problems.local_steps if problems.kind == "model_delta" else 1
    noise = _BottleneckNoise(problems.model, problems.batch_size, forwards)
    try:
        return not _small_convolutions(problems, noise)
    finally:
        noise.close()


def _rowwise_forward(ps: ProblemSet, rowwise: RowwiseForward, rows: dict[str, Tensor], fixed: dict[str, Tensor],
                     x: Tensor, y: Tensor, eps: Tensor) -> tuple[Tensor, tuple]:
    """:attr:`UpdateSimulator.forward`'s signature in the row-wise form
    (:func:`~leakgym.models.parameter_sets.batched_loss` with ``rowwise``; no BN statistics, no noise: the
    row-wise form takes models without either)."""
    if ps.batched:
        return batched_loss(ps.model, {**fixed, **rows}, x, y, rowwise=rowwise), ()
    # parameters shared by every problem: the same tensor for every row
    return batched_loss(ps.model, rows, x, y, shared=fixed, rowwise=rowwise), ()


_GLOBAL_RNG = ("the model draws from torch's global RNG in its forward pass (other than PRECODE's bottleneck, "
               "which the engine feeds per-problem noise); per-problem seeds cannot reach it. Use a deterministic "
               "model, or vectorize=False (the sequential path does not check)")


class UpdateSimulator:
    """Computes dummy updates (and BN statistics) for the engine's rows: vectorised or looped.

    Rows are problems x restarts: problem ``i`` owns ``restarts[i]`` consecutive rows (``restarts`` is
    one count for every problem or one per problem), which share the problem's parameters, targets
    and learning rate. :meth:`select` restricts the computation to a subset of rows (the problems still
    within their budget); the per-row copies of the parameters are made once per selection.
    Call :meth:`close` when done: it removes the hooks and forward overrides from the model copy.
    """

    def __init__(self, problems: ProblemSet, restarts: int | Sequence[int], record_bn: bool) -> None:
        self.ps = problems
        counts = [restarts] * problems.n if isinstance(restarts, int) else list(restarts)
        if len(counts) != problems.n:
            raise ValueError(f"got {len(counts)} restart counts for {problems.n} problems")
        self.names = list(problems.targets)
        forwards = problems.local_steps if problems.kind == "model_delta" else 1
        self.recorder = BatchNormInputStatistics(problems.model, unbiased=False, enabled=record_bn)
        self.noise = _BottleneckNoise(problems.model, problems.batch_size, forwards)
        model, recorder, noise = problems.model, self.recorder, self.noise

        def loss_fn(free: dict[str, Tensor], fixed: dict[str, Tensor], x: Tensor, y: Tensor):
            recorder.start()
            loss = task_loss(model, x, y, params={**fixed, **free})
            return loss, recorder.stop()

        def forward_fn(free, fixed, x, y, eps):
            noise.start(eps)
            try:
                return loss_fn(free, fixed, x, y)
            finally:
                noise.stop()

        def update_fn(free, fixed, x, y, lr, eps):
            noise.start(eps)
            try:
                if problems.kind == "gradient":
                    g, stats = grad(loss_fn, has_aux=True)(free, fixed, x, y)
                    return {n: g[n] for n in names}, stats
                p, stats = free, None
                for _ in range(problems.local_steps):
                    g, st = grad(loss_fn, has_aux=True)(p, fixed, x, y)
                    stats = st if stats is None else stats
                    p = {n: p[n] - lr * g[n] for n in p}
                return {n: free[n] - p[n] for n in names}, stats
            finally:
                noise.stop()

        self.loss_fn = loss_fn
        names = self.names
        pdim = 0 if problems.batched else None

        # The vmap form (leakgym.models.parameter_sets.vmapped) over the rows of ``x``: small convolutions
        # as unfold + matrix product, the unfold a matrix product from enough rows.
        def vmapped_forward(rows, fixed, x, y, eps):
            return vmapped(forward_fn, x.shape[0], (0, pdim, 0, 0, 0))(rows, fixed, x, y, eps)

        def vmapped_update(free, fixed, x, y, lr, eps):
            return vmapped(update_fn, x.shape[0], (pdim, pdim, 0, 0, 0, 0))(free, fixed, x, y, lr, eps)

        # Two vectorised formulations, the same maths (tests: both equal the sequential loop). Every
        # random number comes in through ``eps``: a random op inside the model is an error.
        self.row_leaves = _small_convolutions(problems, self.noise)
        if self.row_leaves:
            # Only the forward pass is vmapped; every row owns its parameters (see :meth:`select`), so
            # the gradient of the rows' summed losses is each row's own gradient, computed by plain
            # autograd (``create_graph`` for the engine's double backward). Measured per engine
            # iteration, digits LeNet, 1 thread: 24 rows 9.9 vs 12.1 ms, 64 rows 20.7 vs 24.5 ms.
            # A plain stack of layers (DLG's LeNet) skips vmap too: its rows' losses as batched
            # operations (:mod:`leakgym.models.rowwise`, which has the measurements).
            # (the row-wise form is a function of the problems, not a method of self: a bound method
            # stored on its own object is a reference cycle, which only the cyclic collector frees; the
            # game pauses that collector during a round: leakgym.game.round.collector_paused)
            self.rowwise = rowwise = RowwiseForward.of(problems.model)
            self.forward = vmapped_forward if rowwise is None else partial(_rowwise_forward, problems, rowwise)
        else:
            # vmap(grad): with larger convolutions the per-row parameters of the other form make every
            # forward convolution a grouped one and hold a per-row copy of every weight -- measured
            # 15% slower for the CIFAR ConvNet at 16 rows, and out of memory for ResNet-18 at 64 rows.
            self.vmapped = vmapped_update
            self.rowwise = None
        # On a CPU, the vmap(grad) of a large model loses to its rows one after another (measured at
        # leakgym.models.parameter_sets.CPU_VMAP_MAX_PARAMETERS: ResNet-18, 8 rows, 342 vs 220 ms per row and
        # iteration): :meth:`updates` takes the sequential form for them.
        self.row_by_row = not self.row_leaves and not vmap_pays_off(problems.model)
        self._leaves: list[dict[str, Tensor]] | None = None
        self.select(torch.repeat_interleave(torch.arange(problems.n, device=problems.device),
                                            torch.tensor(counts, device=problems.device)))

    @property
    def noise_numel(self) -> int:
        """Bottleneck noise entries per row and simulated update (0 for deterministic models)."""
        return self.noise.numel

    def select(self, owner: Tensor) -> None:
        """Compute only the rows whose problems are ``owner`` (``(P',)`` problem index of each row).

        With per-row leaves (:attr:`row_leaves`) each selected row gets its own leaf copy of its
        problem's free parameters (an expanded view when all problems share one model), the variables
        of the rows' dummy gradients; otherwise the rows' problems' parameters, as ``vmap(grad)`` takes them."""
        ps = self.ps
        self.owner = owner
        self._owner = owner.tolist()
        rows = owner.shape[0]
        same = rows == ps.n and bool(torch.equal(owner, torch.arange(ps.n, device=owner.device)))
        pick = (lambda t: t) if same else (lambda t: t.index_select(0, owner))
        if not self.row_leaves:
            self._rows = {n: pick(t) for n, t in ps.free.items()} if ps.batched else ps.free
        elif ps.batched:
            self._rows = {n: pick(t).detach().requires_grad_(True) for n, t in ps.free.items()}
        else:
            self._rows = {n: t.detach().expand(rows, *t.shape).requires_grad_(True) for n, t in ps.free.items()}
        self._fixed = {n: pick(t) for n, t in ps.fixed.items()} if ps.batched else ps.fixed
        self._lr = pick(ps.local_lr)

    def vectorised(self, x: Tensor, y: Tensor, eps: Tensor) -> tuple[dict[str, Tensor], tuple]:
        """Dummy updates of the selected rows as one vectorised computation -- per simulated step a
        vmapped forward pass and one ``torch.autograd.grad(..., create_graph=True)`` (:attr:`row_leaves`),
        else one ``vmap(grad)`` call; ``eps`` is ``(P', noise_numel)``."""
        ps, names = self.ps, self.names
        try:
            if not self.row_leaves:
                return self.vmapped(self._rows, self._fixed, x, y, self._lr, eps)
            if ps.kind == "gradient":
                losses, stats = self.forward(self._rows, self._fixed, x, y, eps)
                keys = list(self._rows)
                gs = torch.autograd.grad(losses.sum(), [self._rows[k] for k in keys], create_graph=True,
                                         materialize_grads=True)
                g = dict(zip(keys, gs))
                return {n: g[n] for n in names}, stats
            steps = ps.local_steps
            # One slice of the noise per forward pass, in the order the steps draw it.
            chunks = eps.reshape(eps.shape[0], steps, eps.shape[1] // steps)
            cur, stats = dict(self._rows), None
            keys = list(cur)
            for s in range(steps):
                losses, st = self.forward(cur, self._fixed, x, y, chunks[:, s])
                stats = st if stats is None else stats
                gs = torch.autograd.grad(losses.sum(), [cur[k] for k in keys], create_graph=True,
                                         materialize_grads=True)
                cur = {k: cur[k] - self._lr.view(-1, *([1] * (cur[k].dim() - 1))) * g for k, g in zip(keys, gs)}
            return {n: self._rows[n] - cur[n] for n in names}, stats
        except RuntimeError as e:
            if "randomness" not in str(e):
                raise
            raise ValueError(_GLOBAL_RNG) from e

    def updates(self, x: Tensor, y: Tensor, eps: Tensor, *, vectorize: bool = True) -> tuple[dict[str, Tensor], tuple]:
        """The selected rows' dummy updates in the engine's form for them: :meth:`vectorised`, or
        :meth:`sequential` for ``vectorize=False`` (the reference loop) and for a large model on a CPU
        (:attr:`row_by_row`). The second keeps the first's guarantee that a row's random numbers are its
        problem's own: a model that draws from torch's global RNG is refused."""
        if not vectorize:
            return self.sequential(x, y, eps)
        if not self.row_by_row:
            return self.vectorised(x, y, eps)
        state = torch.get_rng_state()  # (row_by_row is a CPU form: the CPU generator is the one to watch)
        out = self.sequential(x, y, eps)
        if not torch.equal(torch.get_rng_state(), state):
            raise ValueError(_GLOBAL_RNG)
        return out

    def sequential(self, x: Tensor, y: Tensor, eps: Tensor) -> tuple[dict[str, Tensor], tuple]:
        """The same dummy updates of the selected rows, one row at a time with ``torch.autograd.grad``."""
        ps = self.ps
        if self._leaves is None:
            # Leaf copies of each problem's parameters that autograd can differentiate.
            self._leaves = [
                {k: (t[i] if ps.batched else t).detach().clone().requires_grad_(True) for k, t in ps.free.items()}
                for i in range(ps.n)
            ]
            self._fixed_rows = [{k: (t[i] if ps.batched else t) for k, t in ps.fixed.items()} for i in range(ps.n)]
        outs: list[dict[str, Tensor]] = []
        all_stats: list[tuple] = []
        for p in range(x.shape[0]):
            i = self._owner[p]
            free, fixed = self._leaves[i], self._fixed_rows[i]
            lr = ps.local_lr[i]
            self.noise.start(eps[p])
            try:
                if ps.kind == "gradient":
                    loss, stats = self.loss_fn(free, fixed, x[p], y[p])
                    gs = torch.autograd.grad(loss, [free[n] for n in self.names], create_graph=True)
                    outs.append(dict(zip(self.names, gs)))
                else:
                    cur, stats = dict(free), None
                    keys = list(cur)
                    for _ in range(ps.local_steps):
                        loss, st = self.loss_fn(cur, fixed, x[p], y[p])
                        stats = st if stats is None else stats
                        gs = torch.autograd.grad(loss, [cur[k] for k in keys], create_graph=True)
                        cur = {k: cur[k] - lr * g for k, g in zip(keys, gs)}
                    outs.append({n: free[n] - cur[n] for n in self.names})
            finally:
                self.noise.stop()
            all_stats.append(stats)
        update = {n: torch.stack([o[n] for o in outs]) for n in self.names}
        stats = tuple(
            (torch.stack([s[j][0] for s in all_stats]), torch.stack([s[j][1] for s in all_stats]))
            for j in range(len(all_stats[0]))
        )
        return update, stats

    def close(self) -> None:
        self.recorder.close()
        self.noise.close()


__all__ = ["ProblemSet", "UpdateSimulator", "simulates_whole_updates"]
