"""The pool sizes in order, checked once: 0 < top-k <= capacity <= host <= experts.

A token's k experts must fit the device's C slots together, the device's experts are held
in host memory (H; without a disk every expert is), and no pool holds more experts than
there are (N). Every place that takes these sizes (a flag, a config key, a rule, the
optimum) checks them here, naming itself in the line it refuses with.
"""

from __future__ import annotations

from itertools import pairwise

from moecache.errors import MoecacheError

NAMES = ("top-k", "capacity", "host", "experts")


def check_shape(
    top_k: int | None = None,
    capacity: int | None = None,
    experts: int | None = None,
    host: int | None = None,
    *,
    where: str,
    error: type[MoecacheError] = MoecacheError,
    note: str = "",
) -> None:
    """Refuse, in one line that opens with `where` and names the bound that fails, sizes
    out of order: 0 < top_k <= capacity <= host <= experts, over those given (None: not
    checked; each given is at least 1). `error`: the class raised (a config
    key's is config.keys.ConfigError); `note` ends the line."""
    sizes = zip(NAMES, (top_k, capacity, host, experts), strict=True)
    given = [(name, value) for name, value in sizes if value is not None]
    need = "need 0 < " + " <= ".join(f"{name} {value}" for name, value in given)
    tail = f" ({need}){'; ' + note if note else ''}"
    for name, value in given:
        if value < 1:
            raise error(f"{where}: {name} {value} is below 1{tail}")
    for (low, a), (high, b) in pairwise(given):
        if a > b:
            raise error(f"{where}: {low} {a} is larger than {high} {b}{tail}")
