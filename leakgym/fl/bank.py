"""The global models of N games as stacked tensors: ``name -> (N, *shape)``, one row per game.

A vector of N games used to keep N independent ``nn.Module`` s, and every batched phase of a round
re-assembled them: ``torch.stack`` of N parameters per name for the victims' clean updates, again for
the benign clients, a copy of each model's parameters back after aggregation, a clone of every
parameter of every game for the round's snapshot, and the attack engine compared the models pairwise.
That is ``N x (number of parameters)`` small host operations per phase (on a GPU, a kernel launch
each): at N = 256 LeNets on the digits scenario, 60 ms of an 830 ms host-bound vector step.

:class:`ModelBank` holds the parameters of the N models as one tensor per name, and each game's module
keeps working: its parameters are *views* of its row (``nn.Parameter`` objects sharing the bank's
storage), so code that reads or updates a model in place (a forward pass, ``Server.aggregate``'s
``sub_``, ``load_state_dict``) reads and writes the bank. The batched phases read the stacks directly:
:func:`leakgym.fl.batched.stack_parameters` of bound models is one ``index_select`` per name
(:meth:`ModelBank.of` finds their bank and rows), an aggregation writes all games back with one
``index_copy_`` per name (:meth:`ModelBank.scatter`), and a round's snapshot is one copy per name
(:meth:`ModelBank.gather`).

Scope: parameters only. Buffers (BatchNorm running statistics) stay in their modules: a buffer that
is a view would make every ``copy.deepcopy`` of its model copy the whole bank (``Tensor.__deepcopy__``
copies the storage; ``Parameter.__deepcopy__`` clones the view), and the engine and the clients deep-copy
models. The invariant a bound model must keep: its parameters are updated in place only. Replacing a
parameter's data (``.data = ...``, ``.to()`` another dtype or device) takes it out of the bank, and
:meth:`ModelBank.of` sees that (it compares each bound parameter's address with its row's) and treats the
model as unbound. Replacing the ``nn.Parameter`` object on its module (``module.weight = nn.Parameter(...)``)
is not seen -- checking it would walk every module of every model, the cost the bank exists to remove --
so code that does it must :meth:`ModelBank.bind` the model again (LeakGym's game code never does; a game
binds the model it builds at every reset). Two more consequences of views: a bound model's ``state_dict()``
values are views too, so ``torch.save`` or ``copy.deepcopy`` of it writes or copies every row of the bank
(``{k: v.clone() ...}`` copies one model's); and the rows of a name share one autograd version counter, so an
in-place write to any row (an aggregation) invalidates a graph that saved another bound model's parameters
for its backward pass (LeakGym differentiates copies, or finishes each backward pass before the next write).

Measured (LeNet, digits, one CPU thread, N = 256, iterations=[1] num_clients=1 eval_size=16, GC off, median
of 10 vector steps): 790 -> 755 ms per step; snapshot of all games 18 -> 3 ms, ``stack_parameters`` 10 ->
1.7 ms. On a GPU the operations saved are kernel launches (not measured: no GPU was lent).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from leakgym.checks import is_integer

# model -> (its bank, its row); weak on both sides, so a bank and its models die with their games
_BOUND: weakref.WeakKeyDictionary[nn.Module, tuple[weakref.ReferenceType, int]] = weakref.WeakKeyDictionary()
_data_ptr = Tensor.data_ptr  # (mapped over a row's parameters: no generator frame per parameter)


class ModelBank:
    """The parameters of ``size`` models of one architecture, stacked; model ``i`` holds views of row ``i``.

    Rows are filled by :meth:`bind` (a game binds its model at every reset); the stacks are allocated
    at the first bind, on that model's device and dtypes, and every later model must have the same
    parameters (names, shapes, dtypes, devices).
    """

    def __init__(self, size: int) -> None:
        if not is_integer(size) or size < 1:
            raise ValueError(f"size={size!r}; allowed: integers >= 1")
        self.size = int(size)
        self.stacks: dict[str, Tensor] = {}
        """``name -> (size, *shape)``: every bound model's parameters."""
        self._layout: tuple | None = None  # (name, shape, dtype, device) of each parameter
        self._names: tuple[str, ...] = ()  # the layout's names
        self._models: list[weakref.ReferenceType | None] = [None] * size
        self._params: list[tuple[Tensor, ...]] = [()] * size  # the Parameter objects bound at each row
        self._addresses: list[tuple[int, ...]] = [()] * size  # where their data lies (the row's storage)

    @staticmethod
    def _layout_of(model: nn.Module) -> tuple:
        return tuple((n, tuple(p.shape), p.dtype, p.device) for n, p in model.named_parameters())

    def bind(self, row: int, model: nn.Module) -> None:
        """Make ``model``'s parameters views of row ``row``, holding their current values (and
        ``requires_grad``). The model bound there before is released: its parameters become copies of
        their last values, so it no longer changes with the row."""
        row = self._row(row)
        layout = self._layout_of(model)
        if not layout:
            raise ValueError(f"{type(model).__name__} has no parameters to bank")
        if self._layout is not None and layout != self._layout:
            raise ValueError(f"{type(model).__name__} does not have the bank's parameters (name, shape, dtype, "
                             f"device): {layout} vs {self._layout}")
        found = ModelBank.of([model])
        if found is not None and (found[0] is not self or found[1] != [row]):
            raise ValueError("the model is bound to another bank or row; bind a model to one row only")
        # Checked: from here on the bank changes (a refused first bind fixed the layout for the next model).
        if self._layout is None:
            self._layout = layout
            self._names = tuple(n for n, *_ in layout)
            self.stacks = {n: torch.zeros((self.size, *shape), dtype=dtype, device=device)
                           for n, shape, dtype, device in layout}
        self.release(row)

        def view(name: str, p: Tensor) -> nn.Parameter:
            self.stacks[name][row].copy_(p)
            return nn.Parameter(self.stacks[name][row], requires_grad=p.requires_grad)

        with torch.no_grad():
            bound = _replace_parameters(model, view)
        self._models[row] = weakref.ref(model)
        self._params[row] = bound
        self._addresses[row] = tuple(p.data_ptr() for p in bound)
        _BOUND[model] = (weakref.ref(self), row)

    def release(self, row: int) -> None:
        """Unbind the model bound at ``row`` (if any, and still bound there): its parameters become copies
        of their values."""
        row = self._row(row)
        ref = self._models[row]
        model = None if ref is None else ref()
        self._models[row], self._params[row], self._addresses[row] = None, (), ()
        entry = None if model is None else _BOUND.get(model)
        if entry is None or entry[0]() is not self or entry[1] != row:
            # Gone, or bound elsewhere since (a model whose data left this row may be bound again at
            # another row or bank): releasing it here would take it out of its new row.
            return
        _BOUND.pop(model)
        _replace_parameters(model, lambda _, p: nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))

    def __getstate__(self) -> dict:
        """A copy (``copy.deepcopy``, pickle) holds the stacks' values but binds no model. Its rows must not
        name the original's models: binding a model at a row of the copy (a copied game's reset) would
        release the original game's model from *its* bank. The models copied along are not bound to the
        copy either (:meth:`of` finds no entry for them; a deep copy's parameters are clones anyway) until a
        reset binds new ones. Weak references do not pickle."""
        state = dict(self.__dict__)
        state.update(_models=[None] * self.size, _params=[()] * self.size, _addresses=[()] * self.size)
        return state

    def _intact(self, row: int) -> bool:
        """Whether the parameters bound at ``row`` still share the row's storage (nobody replaced their data)."""
        return tuple(map(_data_ptr, self._params[row])) == self._addresses[row]

    @staticmethod
    def of(models: Sequence[nn.Module]) -> tuple[ModelBank, list[int]] | None:
        """``(bank, rows)`` when every model is bound to one bank (distinct rows) and still holds its row's
        views; None otherwise (the caller stacks the models itself)."""
        rows, bank = [], None
        for m in models:
            entry = _BOUND.get(m)
            if entry is None:
                return None
            b = entry[0]()
            if b is None or (bank is not None and b is not bank):
                return None
            bank = b
            rows.append(entry[1])
        if bank is None or len(set(rows)) != len(rows):
            return None
        if not all(bank._intact(r) for r in rows):
            return None
        return bank, rows

    @staticmethod
    def named_parameters(model: nn.Module) -> tuple[tuple[str, nn.Parameter], ...] | None:
        """``tuple(model.named_parameters())`` of a model bound to a bank that still holds its row's views,
        read from the bank without walking the model's modules; None for any other model (walk it). The
        per-game walks of a round (the attack reading each game's model, the defense pipeline checking each
        clean update's names) were about 0.1 ms a game, 100 ms of a vector step at 1,024 games, on a CPU.
        It rests on the invariant the bank already keeps (module docstring): a bound model's parameter
        objects are the ones it bound, in ``named_parameters`` order."""
        found = ModelBank.of([model])
        if found is None:
            return None
        bank, (row,) = found
        return tuple(zip(bank._names, bank._params[row]))

    def _row(self, row: int) -> int:
        """``row`` as an int when it is an integer (numpy's too, not a bool) in ``[0, size)``; ``ValueError``
        naming it and the range otherwise (``release(-1)`` released the last row)."""
        if not is_integer(row) or not 0 <= row < self.size:
            raise ValueError(f"row={row!r}; allowed: integers in [0, {self.size - 1}]")
        return int(row)

    def _index(self, rows: Sequence[int]) -> Tensor:
        """The rows as an index tensor on the bank's device, checked: integers in ``[0, size)`` (an index out of
        range was torch's IndexError), read on the host before the transfer (no device synchronisation)."""
        if not self.stacks:
            raise ValueError("the bank holds no model yet: bind one before gathering or scattering rows")
        rows = rows.tolist() if isinstance(rows, (Tensor, np.ndarray)) else list(rows)
        if not all(is_integer(r) for r in rows):  # (a float or a bool is not a row; numpy and torch integers are)
            raise ValueError(f"rows={rows[:8]!r}{'...' if len(rows) > 8 else ''}; allowed: integers in "
                             f"[0, {self.size - 1}]")
        rows = [int(r) for r in rows]
        index = torch.tensor(rows, dtype=torch.int64)
        if rows and not (0 <= min(rows) and max(rows) < self.size):
            raise ValueError(f"rows span {min(rows)}..{max(rows)}; allowed: integers in [0, {self.size - 1}]")
        return index.to(next(iter(self.stacks.values())).device)

    def _names_known(self, names) -> None:
        unknown = [n for n in names if n not in self.stacks]
        if unknown:
            raise ValueError(f"parameter names {unknown} are not the bank's; allowed: {list(self.stacks)}")

    def gather(self, rows: Sequence[int], names: Sequence[str] | None = None) -> dict[str, Tensor]:
        """``name -> (len(rows), *shape)``: a copy of the rows' parameters (all names, or ``names``)."""
        index = self._index(rows)
        if names is not None:
            self._names_known(names)
        return {n: self.stacks[n].index_select(0, index) for n in (self.stacks if names is None else names)}

    @torch.no_grad()
    def scatter(self, rows: Sequence[int], values: dict[str, Tensor]) -> None:
        """Write ``values`` (``name -> (len(rows), *shape)``) into the rows: every bound model of those
        rows now holds them (in place, one copy per name). Every name and shape is checked before the first
        write."""
        index = self._index(rows)
        self._names_known(values)
        for n, v in values.items():
            if tuple(v.shape) != (len(index), *self.stacks[n].shape[1:]):
                raise ValueError(f"values[{n!r}] has shape {tuple(v.shape)}; allowed: "
                                 f"{(len(index), *self.stacks[n].shape[1:])} (one row per row written)")
        for n, v in values.items():
            self.stacks[n].index_copy_(0, index, v.to(self.stacks[n]))


def _replace_parameters(model: nn.Module, make) -> tuple[nn.Parameter, ...]:
    """Put ``make(name, p)`` in place of every parameter ``p`` of ``model``, once per parameter object:
    a parameter that several modules share (tied weights) is listed once by ``named_parameters``, and
    every module holding it must get the same replacement, or the tie breaks. Returns the replacements,
    in ``named_parameters`` order."""
    modules = dict(model.named_modules(remove_duplicate=False))
    made: dict[int, nn.Parameter] = {}
    for name, p in list(model.named_parameters(remove_duplicate=False)):
        if id(p) not in made:  # the list holds every old parameter: ids are not reused meanwhile
            made[id(p)] = make(name, p)
        owner, _, attr = name.rpartition(".")
        modules[owner]._parameters[attr] = made[id(p)]
    return tuple(made.values())


__all__ = ["ModelBank"]
