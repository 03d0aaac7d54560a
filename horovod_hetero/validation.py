"""Argument checks, schedules and addresses shared by every module.

Bad configuration fails at construction with a ``TypeError``/``ValueError`` that names the
argument and the allowed values, before any collective is entered.
"""
import math
import numbers


def check_int(name, value, minimum=None, maximum=None):
    """Return ``value`` if it is an int in ``[minimum, maximum]``, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    _check_range(name, value, minimum, maximum)
    return int(value)


def check_float(name, value, minimum=None, maximum=None, min_exclusive=False):
    """Return ``value`` as a float if it is a finite number in range, else raise naming ``name``.

    Example:
        >>> check_float("timeout", float("inf"))
        Traceback (most recent call last):
        ...
        ValueError: timeout must be a finite number, got inf
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if min_exclusive and minimum is not None and value <= minimum:
        raise ValueError(f"{name} must be > {minimum}, got {value!r}")
    _check_range(name, value, minimum, maximum)
    return float(value)


def _check_range(name, value, minimum, maximum):
    if minimum is not None and value < minimum:
        hint = f"an int >= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {hint}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")


def as_schedule(name, value, minimum=1):
    """Convert an int or a ``step -> int`` callable into a checked ``step -> int`` function.

    An int becomes a constant schedule (checked now); a callable is checked each time it is
    evaluated, so a schedule that returns a bad value fails with the argument's name.

    Example:
        >>> period = as_schedule("period", lambda step: 2 if step < 10 else 8)
        >>> period(0), period(10)
        (2, 8)
    """
    if callable(value):
        def schedule(step):
            return check_int(f"{name}({step})", value(step), minimum)
        schedule.__doc__ = f"{name} schedule from {value!r}"
        return schedule
    constant = check_int(name, value, minimum)
    return lambda step: constant


def parse_address(address, name="server_address"):
    """``tcp://host:port`` (or ``host:port``) -> ``(host, port)``, else a ``ValueError`` naming ``name``.

    Example:
        >>> parse_address("tcp://127.0.0.1:5555")
        ('127.0.0.1', 5555)
    """
    if not isinstance(address, str):
        raise TypeError(f"{name} must be a string like tcp://host:port, got {address!r} ({type(address).__name__})")
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{name} must look like tcp://host:port, got {address!r}")
    return host, int(port)
