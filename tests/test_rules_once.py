"""Each rule is written once (issue 49, point 3): compiled rules only beside their policy
and the one kernel table, the tier schedule in policies/tiers.py, the pool sizes' order in
records/shape.py. What each place computes is tested where it lives; this file holds that
no second copy grows elsewhere."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "moecache"


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


def named(node) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def test_compiled_code_lives_with_the_rules():
    """numba only in policies/ (each rule's hooks and kernels.py's one table) and the
    counting rule they share: no second compiled loop of a rule in replay or elsewhere."""
    found = []
    for where, tree in modules():
        for node in ast.walk(tree):
            imports = isinstance(node, ast.Import | ast.ImportFrom) and any(
                "numba" in (getattr(node, "module", None) or alias.name) for alias in node.names
            )
            decorated = isinstance(node, ast.FunctionDef) and any(
                named(d) in ("compiled", "njit", "jit") for d in node.decorator_list
            )
            if (imports or decorated) and not (
                where.startswith("policies/") or where == "records/counting.py"
            ):
                found.append(f"{where}:{node.lineno}")
    assert not found, "compiled code outside the rules:\n" + "\n".join(found)


def test_the_pool_sizes_are_ordered_in_one_place():
    """No chained comparison over a capacity (k <= C <= H <= N) outside records/shape.py."""
    found = []
    for where, tree in modules():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Compare) and len(node.ops) > 1):
                continue
            names = {named(n) for n in (node.left, *node.comparators)}
            if any("capacity" in n for n in names) and where != "records/shape.py":
                found.append(f"{where}:{node.lineno}")
    assert not found, "a range check of its own:\n" + "\n".join(found)


def test_the_tier_schedule_is_decided_in_one_place():
    """Admission's device step and the tier classes: called and defined in policies/tiers.py
    only, beneath both the tiered replay and the tiered harness."""
    found = []
    for where, tree in modules():
        for node in ast.walk(tree):
            calls = isinstance(node, ast.Call) and named(node.func) == "device_step"
            defines = isinstance(node, ast.ClassDef) and node.name in ("DeviceTier", "HostTier")
            if (calls or defines) and where != "policies/tiers.py":
                found.append(f"{where}:{node.lineno}")
    assert not found, "the tier schedule written again:\n" + "\n".join(found)
