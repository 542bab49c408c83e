"""The families that have an adapter, by transformers' model_type, found rather than listed:
a family's adapter is the module `model/<model_type>.py` whose `MoeAdapter` subclass says
`family = "<model_type>"` (docs/adding-a-model.md). Everything that lists families (the
config's check, the tiny models, the tests, the rehearsal builder, the GPU check) reads
them here, so adding a family is adding its file."""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

from moecache import model as package
from moecache.errors import MoecacheError
from moecache.model.adapter import MoeAdapter


def declares_family(path: Path) -> bool:
    """Whether the module at `path` declares the family it is named after. Read, not
    imported: the package's other modules (the loader, the quantized experts, training)
    stay unloaded until something needs them."""
    pattern = rf'^\s+family = "{re.escape(path.stem)}"\s*$'
    return re.search(pattern, path.read_text(), re.MULTILINE) is not None


def adapter_class(name: str) -> type[MoeAdapter]:
    """The one MoeAdapter subclass that `model/<name>.py` defines for family `name`."""
    module = importlib.import_module(f"{package.__name__}.{name}")
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, MoeAdapter)
        and value.__dict__.get("family") == name
    ]
    if len(found) != 1:
        raise MoecacheError(
            f"{module.__file__}: declares family {name!r} in {len(found)} MoeAdapter "
            "subclasses; an adapter module holds exactly one"
        )
    return found[0]


def discover() -> dict[str, type[MoeAdapter]]:
    """Every family's adapter in the model package's folders (`__path__`, which a test may
    extend with a temporary folder), by family name."""
    names = {
        path.stem
        for folder in package.__path__
        for path in Path(folder).glob("*.py")
        if declares_family(path)
    }
    return {name: adapter_class(name) for name in sorted(names)}


ADAPTERS: dict[str, type[MoeAdapter]] = discover()


def refresh() -> None:
    """Find the adapters again, in place (a test that adds a family, and its cleanup)."""
    ADAPTERS.clear()
    ADAPTERS.update(discover())
    adapter_for.cache_clear()


@functools.cache
def adapter_for(model_type: str) -> MoeAdapter:
    """The adapter of a checkpoint's model_type (one instance each: adapters hold no state,
    and the decode asks per token); one line naming those that exist if none."""
    if model_type not in ADAPTERS:
        raise MoecacheError(
            f"model_type {model_type!r} has no adapter; families with one: "
            + ", ".join(sorted(ADAPTERS))
        )
    return ADAPTERS[model_type]()


def of(model) -> MoeAdapter:
    """The adapter of a loaded model."""
    return adapter_for(model.config.model_type)
