"""Argument checks, schedules and addresses shared by every module.

Bad configuration fails at construction with a ``TypeError``/``ValueError`` that names the
argument and the allowed values, before any collective is entered.
"""
from __future__ import annotations

import ipaddress
import math
import numbers
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is ``True`` or ``False`` (not a string, a number or None), else raise naming ``name``.

    Example:
        >>> check_bool("wait_avoiding", "no")
        Traceback (most recent call last):
        ...
        TypeError: wait_avoiding must be True or False, got 'no' (str)
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def check_int(name: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` if it is an int in ``[minimum, maximum]``, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    _check_range(name, value, minimum, maximum)
    return int(value)


def check_float(name: str, value: object, minimum: float | None = None, maximum: float | None = None,
                min_exclusive: bool = False) -> float:
    """Return ``value`` as a float if it is a finite number in range, else raise naming ``name``.

    Example:
        >>> check_float("timeout", float("inf"))
        Traceback (most recent call last):
        ...
        ValueError: timeout must be a finite number, got inf
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if min_exclusive and minimum is not None and value <= minimum:
        raise ValueError(f"{name} must be > {minimum}, got {value!r}")
    _check_range(name, value, minimum, maximum, kind="a number")
    return float(value)


def _check_range(name: str, value: numbers.Real, minimum: float | None, maximum: float | None,
                 kind: str = "an int") -> None:
    if minimum is not None and value < minimum:
        hint = f"{kind} >= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {hint}, got {value!r}")
    if maximum is not None and value > maximum:  # type: ignore[operator]  # typeshed's numbers.Real lacks __gt__
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")


def check_loss(value: object, name: str = "loss") -> float:
    """A training loss as a float: a real number, or a one-element tensor or array (``.item()``).
    NaN and infinity pass (strategies skip them); anything else raises a ``TypeError`` naming ``name``.

    Example:
        >>> check_loss(0.5), check_loss(float("nan"))
        (0.5, nan)
        >>> check_loss("0.5")
        Traceback (most recent call last):
        ...
        TypeError: loss must be a number or a one-element tensor, got '0.5' (str)
    """
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, numbers.Real):
        try:
            value = item()                      # a tensor of several elements raises here
        except (ValueError, RuntimeError, TypeError):
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number or a one-element tensor, got {value!r} ({type(value).__name__})")
    return float(value)


def as_schedule(name: str, value: int | Callable[[int], int], minimum: int = 1) -> Callable[[int], int]:
    """Convert an int or a ``step -> int`` callable into a checked ``step -> int`` function.

    An int becomes a constant schedule (checked now); a callable is checked each time it is
    evaluated, so a schedule that returns a bad value fails with the argument's name.

    Example:
        >>> period = as_schedule("period", lambda step: 2 if step < 10 else 8)
        >>> period(0), period(10)
        (2, 8)
    """
    if callable(value):
        def schedule(step: int) -> int:
            return check_int(f"{name}({step})", value(step), minimum)
        schedule.__doc__ = f"{name} schedule from {value!r}"
        return schedule
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum} or a step -> int callable, got {value!r} "
                        f"({type(value).__name__})")
    constant = check_int(name, value, minimum)
    return lambda step: constant


def parse_address(address: object, name: str = "server_address") -> tuple[str, int]:
    """``tcp://host:port`` (or ``host:port``) -> ``(host, port)``, else a ``ValueError`` naming ``name``.

    Example:
        >>> parse_address("tcp://127.0.0.1:5555")
        ('127.0.0.1', 5555)
    """
    if not isinstance(address, str):
        raise TypeError(f"{name} must be a string like tcp://host:port, got {address!r} ({type(address).__name__})")
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if not host or host != host.strip() or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{name} must look like tcp://host:port (port 0 to 65535), got {address!r}")
    return host, int(port)


def check_host(name: str, value: object) -> str:
    """``value`` if it is a host name (letters, digits, ``.``, ``-``, ``_``) or an IP address, else raise
    naming ``name``.

    Example:
        >>> check_host("host", "tcp://h:1")
        Traceback (most recent call last):
        ...
        ValueError: host must be a host name or an IP address (no scheme, no port), e.g. 10.0.0.1, got 'tcp://h:1'
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a host name or an IP address (a str), got {value!r} ({type(value).__name__})")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?", value):
        raise ValueError(f"{name} must be a host name or an IP address (no scheme, no port), e.g. 10.0.0.1, "
                         f"got {value!r}")
    return value


def check_options(name: str, value: object, accepted: Iterable[str]) -> dict[str, Any]:
    """``value`` (a dict of keyword arguments, or None) as a dict, refusing keys not in ``accepted``.

    Example:
        >>> check_options("esync_options", {"timeout": 5.0}, ["timeout", "epsilon"])
        {'timeout': 5.0}
        >>> check_options("esync_options", 5, ["timeout"])
        Traceback (most recent call last):
        ...
        TypeError: esync_options must be a dict of keyword arguments (timeout) or None, got 5 (int)
    """
    accepted = list(accepted)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of keyword arguments ({', '.join(accepted)}) or None, "
                        f"got {value!r} ({type(value).__name__})")
    unknown = [key for key in value if key not in accepted]
    if unknown:
        raise TypeError(f"{name} holds {', '.join(map(repr, unknown))}, which it does not take; it takes "
                        f"{', '.join(accepted) or 'none'}")
    return dict(value)


#: Keyword arguments removed in 0.2.0, with what replaces them (CHANGELOG.md): ``check_removed`` names it.
REMOVED_ARGUMENTS = {
    "global_lr": "ESync's global learning rate is now an outer step given beside the strategy: "
                 "hh.DistributedOptimizer(..., aggregate=hh.Mean(outer=hh.OuterSGD(lr=global_lr))), or the Keras "
                 "callback's aggregate=",
    "aggregate": "how global rounds combine the models is now given beside the strategy: "
                 "hh.DistributedOptimizer(..., aggregate=hh.Normalized()) (or hh.Mean()), or the Keras callback's "
                 "aggregate=",
    "outer": "the outer optimiser is now part of the aggregation given beside the strategy: "
             "aggregate=hh.Mean(outer=hh.OuterSGD(...)) (or hh.Normalized(outer=...)) to hh.DistributedOptimizer or "
             "the Keras callback",
}


def check_removed(owner: str, given: Iterable[str], accepted: Iterable[str] = ()) -> None:
    """Raise a ``TypeError`` naming the replacement if ``given`` (keyword names passed to ``owner``) holds an
    argument removed in 0.2.0 (``REMOVED_ARGUMENTS``) that ``owner`` does not take (``accepted``).

    Example:
        >>> check_removed("ESync", ["mode", "global_lr"])
        Traceback (most recent call last):
        ...
        TypeError: ESync(global_lr=...) was removed in horovod-hetero 0.2.0: ESync's global learning rate is now an outer step given beside the strategy: hh.DistributedOptimizer(..., aggregate=hh.Mean(outer=hh.OuterSGD(lr=global_lr))), or the Keras callback's aggregate= (see CHANGELOG.md)
    """
    accepted = set(accepted)
    for key in given:
        if key in REMOVED_ARGUMENTS and key not in accepted:
            raise TypeError(f"{owner}({key}=...) was removed in horovod-hetero 0.2.0: {REMOVED_ARGUMENTS[key]} "
                            f"(see CHANGELOG.md)")


def check_directory(name: str, value: object) -> str | None:
    """``value`` as a path string if it is a directory that exists or can be created, and written to;
    ``None`` or ``""`` gives ``None``. Raises a ``TypeError``/``ValueError`` naming ``name``; nothing
    is created.

    Example:
        >>> check_directory("telemetry", 5)
        Traceback (most recent call last):
        ...
        TypeError: telemetry must be a directory (a str or os.PathLike) or None, got 5 (int)
    """
    if value is None:
        return None
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a directory (a str or os.PathLike) or None, got {value!r} "
                        f"({type(value).__name__})")
    path = os.fspath(value)
    if not isinstance(path, str):
        raise TypeError(f"{name} must be a directory (a str or os.PathLike) or None, got {value!r} "
                        f"({type(value).__name__})")
    if not path:
        return None
    if "\0" in path:
        raise ValueError(f"{name} must be a directory path, got {value!r} (it holds a NUL character)")
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "is not a directory" if existing == os.path.abspath(path) else f"is under {existing!r}, not a directory"
        raise ValueError(f"{name} must be a directory that can be created and written to; {path!r} {what}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{name} must be a directory that can be created and written to; {existing!r} is not "
                         f"writable")
    return path
