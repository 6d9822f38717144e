"""Names that moved or were renamed, kept working for a release: using one warns (a ``FutureWarning``,
shown by default) naming the new one, and gives the new object.

Example::

    >>> import warnings
    >>> __getattr__ = renamed({"__name__": "old"}, {"root": "math:sqrt"})
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     value = __getattr__("root")(9.0)
    >>> value, str(caught[0].message)
    (3.0, 'old.root is now math.sqrt; the old name goes in the next release')
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` (a name a user types: a class, a module, a config group's option) is now ``new``."""
    warnings.warn(f"{old} is now {new}; the old name goes in the next release", FutureWarning, stacklevel=stacklevel)


#: Config options renamed: group -> {old option: new option}. The old option's file stays a thin alias of the
#: new one for a release; the command warns when it is chosen (:func:`warn_renamed_options`).
RENAMED_OPTIONS = {
    "data": {"adni_synthetic": "adni_phantoms"},
    "strategy": {"ssp": "ssp_delay", "allreduce_asgd": "delayed_averaging", "allreduce_asgd_dc": "delayed_averaging_dc"},
}


#: Classes a config names (``_target_``) that were renamed, old -> new: a run folder recorded with the old one
#: resumes under the new (:func:`lightning_hybrid.run_folder.compared`).
RENAMED_TARGETS = {
    "lightning_hybrid.AllReduceASGDStrategy": "lightning_hybrid.DelayedAveragingStrategy",
    "lightning_hybrid.data.SyntheticADNIDataModule": "lightning_hybrid.data.PhantomADNIDataModule",
    "lightning_hybrid.strategies.common.CheckedDDPStrategy": "lightning_hybrid.strategies.checked_ddp.CheckedDDPStrategy",
}


def current_targets(config: Any) -> Any:
    """``config`` (plain, nested) with each renamed ``_target_`` replaced by its new name."""
    if isinstance(config, Mapping):
        return {key: RENAMED_TARGETS.get(value, value) if key == "_target_" and isinstance(value, str)
                else current_targets(value) for key, value in config.items()}
    if isinstance(config, list):
        return [current_targets(value) for value in config]
    return config


def warn_renamed_options(choices: Mapping[str, Any]) -> None:
    """Warn for each renamed config option among a run's ``choices`` (Hydra's group -> option)."""
    for group, options in RENAMED_OPTIONS.items():
        if str(choices.get(group)) in options:
            warn_renamed(f"{group}={choices[group]}", f"{group}={options[str(choices[group])]}", stacklevel=2)


def renamed_alias(build: Callable[..., Any], old: str, new: str) -> Callable[..., Any]:
    """The factory of a strategy alias renamed ``old`` -> ``new`` (for a registry): it warns, then builds."""

    def factory(**init_params: Any) -> Any:
        warn_renamed(f"strategy={old!r}", f"strategy={new!r}")
        return build(**init_params)

    return factory


def renamed(package: dict[str, Any], table: Mapping[str, str],
            others: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """A module's ``__getattr__`` (pass its ``globals()``) for its old names: ``table`` maps each to
    ``"module"`` (the same name there) or ``"module:new_name"``; using one warns and returns the new object.
    ``others``: the module's ``__getattr__`` for the names not in ``table`` (e.g. :func:`lazy_exports`')."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            if others is not None:
                return others(name)
            raise AttributeError(f"module {package['__name__']!r} has no attribute {name!r}")
        module, _, new = table[name].partition(":")
        warn_renamed(f"{package['__name__']}.{name}", f"{module}.{new or name}")
        return getattr(import_module(module), new or name)

    return __getattr__
