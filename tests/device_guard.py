"""A device check that runs without a GPU: on the CPU every tensor is on one device, so a tensor the project builds
without placing it (no ``device=``, never ``.to(device)``) works here and stops a CUDA run at its first op with a
model's weights. ``UnplacedTensors`` follows where tensors come from instead:

- *unplaced*: built by a factory call (``torch.tensor``, ``zeros``, ``as_tensor``, ``from_numpy`` ...) in the
  project's own code without a ``device`` argument, and whatever is computed from such tensors alone;
- *placed*: a module's parameters, a factory call that names its device, the result of ``.to(<device>)`` (or of
  ``.to(<tensor>)``), and whatever is computed with any placed tensor.

An op that mixes an unplaced tensor of one or more dimensions with a placed one is what CUDA refuses ("Expected all
tensors to be on the same device"); it raises ``Unplaced`` naming the op and where the unplaced tensor was built.
0-dim tensors are exempt, as CUDA accepts CPU scalars. Code of other packages (transformers, DeepSpeed) is taken as
placing its own tensors."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
OWN = tuple(str(ROOT / p) + "/" for p in ("ragen", "tasks", "flows", "scripts"))
FACTORIES = {getattr(torch, n) for n in ("tensor", "as_tensor", "zeros", "ones", "full", "empty", "arange", "rand",
                                         "randn", "randint", "eye", "linspace", "from_numpy")}
PLACED, UNPLACED = "_guard_placed", "_guard_unplaced_at"
MOVES = {torch.Tensor.to, torch.Tensor.cuda}
# CUDA accepts these across devices: a CPU index into a GPU tensor, a copy or an assignment from the CPU
CROSSING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.copy_}


class Unplaced(RuntimeError):
    pass


def _tensors(obj, out: list) -> list:
    """The tensors in an op's arguments or results (nested tuples, lists and dicts; a named tuple is a tuple, a
    transformers output a dict): torch's tree_flatten would do, at several times the cost on every op."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, tuple | list):
        for o in obj:
            _tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out)
    return out


def _caller() -> tuple[str, int]:
    """The first frame outside torch and this file: who asked for the op."""
    f = sys._getframe(2)
    while f is not None and ("/torch/" in f.f_code.co_filename or f.f_code.co_filename == __file__):
        f = f.f_back
    return (f.f_code.co_filename, f.f_lineno) if f is not None else ("?", 0)


class UnplacedTensors(TorchFunctionMode):
    # the marks live on the tensors themselves (tensors compare elementwise, so they cannot key a set)
    def __init__(self) -> None:
        super().__init__()
        self.checked_ops = 0  # ops with tensor arguments seen (a guard that saw nothing proves nothing)

    @staticmethod
    def _is_placed(t: torch.Tensor) -> bool:
        return isinstance(t, torch.nn.Parameter) or getattr(t, PLACED, False)

    @staticmethod
    def _origin(t: torch.Tensor) -> str | None:
        return getattr(t, UNPLACED, None)

    @staticmethod
    def _place(ts, placed: bool = True) -> None:
        for t in ts:
            setattr(t, PLACED, placed)
            if placed and hasattr(t, UNPLACED):
                delattr(t, UNPLACED)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat = _tensors(kwargs, _tensors(args, []))
        results = _tensors(out, [])
        if func in FACTORIES:
            where = _caller()
            if "device" in kwargs:
                self._place(results)
            elif where[0].startswith(OWN):
                for r in results:
                    setattr(r, UNPLACED, f"{Path(where[0]).relative_to(ROOT)}:{where[1]}")
            return out
        if func in MOVES and (any(isinstance(a, torch.device | str | torch.Tensor) for a in args[1:])
                              or "device" in kwargs):
            self._place(results)
            return out
        if func is torch.Tensor.cpu:
            self._place(results, False)
            return out
        if func in CROSSING:  # the indexed or written tensor keeps where it is; a slice goes with it
            src = args[0]
            if func is torch.Tensor.__getitem__:
                if self._is_placed(src):
                    self._place(results)
                elif self._origin(src) is not None:
                    for r in results:
                        setattr(r, UNPLACED, self._origin(src))
            return out
        unplaced = [a for a in flat if self._origin(a) is not None and not self._is_placed(a)]
        placed = [a for a in flat if self._is_placed(a)]
        self.checked_ops += bool(flat)
        if placed:
            bad = [a for a in unplaced if a.dim() > 0]
            if bad:
                name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
                file, line = _caller()
                raise Unplaced(f"{name} at {file}:{line} mixes a tensor built without a device at "
                               f"{self._origin(bad[0])} (shape {tuple(bad[0].shape)}) with a model's tensor: on a "
                               f"GPU this op fails; build it with device=, or move it with .to(device)")
            self._place(r for r in results if self._origin(r) is None)
        elif unplaced:
            origin = self._origin(unplaced[0])
            for r in results:
                if not self._is_placed(r):
                    setattr(r, UNPLACED, origin)
        return out
