"""primal-dt: a Decision Transformer with masked (causal) Primal-Attention for offline RL.

The package's public API is the method (primal_dt.method): the attention layers, each usable on
its own in any model (x (B, L, D) and an optional padding mask (B, L) in, the output and its
auxiliary loss out), the registry that builds them by name, the KSVD objective and loss, and the
Decision Transformer with its config. Importing it needs torch alone: the environments, datasets
and logging are imported by the modules that use them.

The names load on first use (PEP 562), so that `primal-dt --help` and the modules that need no
torch start without importing it; the kinds' classes are exported as the registry lists them.
"""

import importlib
import importlib.util
from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """The method's names (primal_dt.method: its API and every kind's class), loaded on first use;
    `__all__` is theirs too, so that it lists every registered kind."""
    submodule = importlib.util.find_spec(f"{__name__}.{name}") is not None
    if submodule or (name.startswith("__") and name != "__all__"):  # no torch for `from . import`
        raise AttributeError(f"module 'primal_dt' has no attribute {name!r}")
    method = importlib.import_module("primal_dt.method")
    if name == "__all__" or name in method.__all__:
        return getattr(method, name)
    raise AttributeError(f"module 'primal_dt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *importlib.import_module("primal_dt.method").__all__])
