"""The import house: every module of src/moecache sits in a room on a floor, and imports run down.

Rooms are the top-level packages and modules of the package, each room's floor declared
below and every top-level folder of the package a room; the `cli` package (a module per stage's
commands) and `__main__.py` form the room "cli" on the top floor, and no module below it
holds argparse or a `commands.py`. Imports inside functions count like the others. Each
failure lists its arrows as `module -> imported module`. No module passes 400 lines and no
function 60.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "moecache"

FLOORS = {
    "moecache": 0,  # the package's own __init__ (a docstring and the version)
    "errors": 0,
    "gpu": 1,  # the CUDA calls and their rehearsal on a CPU
    "atomic": 1,
    "intervals": 1,
    "runs": 1,
    "provenance": 2,
    "records": 2,
    "policies": 3,
    "prefetch": 3,
    "data": 3,
    "model": 4,
    "config": 5,
    "costs": 6,
    "schedule": 6,
    "harness": 7,
    "replay": 7,
    "plan": 8,
    "learned": 9,
    "router_tuning": 9,
    "controller": 9,
    "accuracy": 9,
    "report": 10,
    "cli": 11,
}
STAGES = {"learned", "router_tuning", "controller", "accuracy"}
CLI_MODULES = {"moecache.__main__"}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported(path: pathlib.Path, module: str) -> set[str]:
    """Every moecache module `module` imports, lazy imports included, as dotted names."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module
            # `from moecache.x import y` imports the module moecache.x.y when y is one, else x
            names.update(resolve(f"{stem}.{alias.name}") for alias in node.names)
    return {resolve(name) for name in names if name == "moecache" or name.startswith("moecache.")}


def resolve(name: str) -> str:
    """The longest prefix of a dotted name that is a module of the package."""
    parts = name.split(".")
    while len(parts) > 1:
        base = PACKAGE.parent.joinpath(*parts)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return ".".join(parts)
        parts = parts[:-1]
    return "moecache"


def room(module: str) -> str:
    parts = module.split(".")
    if module in CLI_MODULES:
        return "cli"
    return parts[1] if len(parts) > 1 else "moecache"


def graph() -> dict[str, set[str]]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        modules[name] = imported(path, name) - {name}
    return modules


GRAPH = graph()


def arrows():
    for source, targets in GRAPH.items():
        for target in sorted(targets):
            yield source, target


def listed(bad) -> str:
    return "\n".join(f"  {a} -> {b}" for a, b in sorted(set(bad)))


def test_every_module_has_a_room_on_a_floor():
    unknown = sorted({room(m) for m in GRAPH} - set(FLOORS))
    assert not unknown, f"rooms without a floor: {unknown}"


def test_every_folder_is_a_room_on_a_floor():
    """A folder of the package is a room by itself: one new folder needs a floor here."""
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders <= set(FLOORS), f"folders without a floor: {sorted(folders - set(FLOORS))}"


def test_the_command_line_lives_on_its_own_floor():
    """No stage declares commands: no `commands.py` and no argparse outside `cli/`."""
    below = [
        p for p in PACKAGE.rglob("*.py") if module_name(p).split(".")[:2] != ["moecache", "cli"]
    ]
    stray = [module_name(p) for p in below if p.name == "commands.py"]
    stray += [module_name(p) for p in below if "argparse" in imported_names(p)]
    assert not stray, f"commands below the cli floor: {sorted(stray)}"


def imported_names(path: pathlib.Path) -> set[str]:
    """Every top-level name `path` imports (`import a.b` and `from a.b import c` give `a`)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_import_runs_up_a_floor():
    bad = [(a, b) for a, b in arrows() if FLOORS[room(b)] > FLOORS[room(a)]]
    assert not bad, "imports to a higher floor:\n" + listed(bad)


def cycle(nodes: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph, as its nodes in order, or None."""
    state = {}
    for start in sorted(nodes):
        if start in state:
            continue
        stack = [(start, iter(sorted(nodes[start])))]
        path = [start]
        state[start] = "open"
        while stack:
            node, following = stack[-1]
            step = next(following, None)
            if step is None:
                state[node] = "done"
                stack.pop()
                path.pop()
            elif state.get(step) == "open":
                return path[path.index(step) :] + [step]
            elif step not in state:
                state[step] = "open"
                path.append(step)
                stack.append((step, iter(sorted(nodes.get(step, ())))))
    return None


def test_no_circle_between_rooms():
    rooms = {}
    behind = {}
    for a, b in arrows():
        if room(a) != room(b):
            rooms.setdefault(room(a), set()).add(room(b))
            behind.setdefault((room(a), room(b)), []).append((a, b))
    found = cycle(rooms)
    assert found is None, f"a circle between rooms: {' -> '.join(found)}\n" + listed(
        arrow for pair in zip(found, found[1:], strict=False) for arrow in behind[pair]
    )


def test_no_circle_between_modules():
    found = cycle(GRAPH)
    assert found is None, "a circle between modules:\n" + listed(
        zip(found, found[1:], strict=False)
    )


def crossing(sources: set[str], targets: set[str]):
    return [(a, b) for a, b in arrows() if room(a) in sources and room(b) in targets]


def test_harness_and_replay_never_import_each_other():
    bad = crossing({"harness"}, {"replay"}) + crossing({"replay"}, {"harness"})
    assert not bad, "harness and replay import each other:\n" + listed(bad)


def test_policies_import_no_stage_and_not_the_harness():
    bad = crossing({"policies"}, STAGES | {"harness"})
    assert not bad, "policies import a stage or the harness:\n" + listed(bad)


def test_report_imports_neither_harness_nor_stages():
    bad = crossing({"report"}, STAGES | {"harness"})
    assert not bad, "the report imports the harness or a stage:\n" + listed(bad)


def test_no_stage_imports_the_report():
    bad = crossing(STAGES, {"report"})
    assert not bad, "a stage imports the report:\n" + listed(bad)


def test_records_import_no_torch():
    records = sorted((PACKAGE / "records").rglob("*.py"))
    bad = [(module_name(p), "torch") for p in records if "torch" in imported_names(p)]
    assert not bad, "records import torch:\n" + listed(bad)


MODULE_LINES, FUNCTION_LINES = 400, 60  # a module one can read through; a function one screen


def test_no_module_or_function_is_over_the_house_limits():
    """Every module at most MODULE_LINES lines and every function at most FUNCTION_LINES
    (its def line to its last, docstring included)."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            long.append(f"  {module_name(path)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long.append(f"  {module_name(path)}.{node.name}: {lines} lines")
    assert not long, "over the house's limits:\n" + "\n".join(long)
