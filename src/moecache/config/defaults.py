"""Every default a study's settings have, stated once: as `default:` in the schema
(workflow/schemas/config.schema.yaml), filled in when a config is loaded.

Snakemake's `validate` fills them on the workflow's path; `fill` does the same on the
command line's, with jsonschema's documented extension of the `properties` keyword, so both
paths hand the stages the same settings and no stage writes a default of its own. A section
left out stays out (its stage does not run); within a section given, every key with a
default is there.
"""

from __future__ import annotations

import copy

import jsonschema


def filling_validator(schema: dict):
    """A validator that, validating an object, first sets each missing key to its default."""
    base = jsonschema.Draft202012Validator
    properties = base.VALIDATORS["properties"]

    def set_defaults(validator, wanted, instance, subschema):
        if validator.is_type(instance, "object"):
            for key, rule in wanted.items():
                if "default" in rule and key not in instance:
                    instance[key] = copy.deepcopy(rule["default"])
        yield from properties(validator, wanted, instance, subschema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})(schema)


def fill(config: dict, schema: dict) -> dict:
    """`config` with every missing default set, in place. Validity is checked apart (the
    loader's one-line errors); iterating the errors is what fills."""
    for _ in filling_validator(schema).iter_errors(config):
        pass
    return config


def section_schema(schema: dict, path: tuple[str, ...]) -> dict:
    """The subschema of the section at `path` (e.g. ("harness",); "*" steps into a mapping's
    values, as ("harness", "runs", "*") into a run), keeping the $defs its $refs point to."""
    node = schema
    for key in path:
        node = node["additionalProperties"] if key == "*" else node["properties"][key]
    return {**node, "$defs": schema.get("$defs", {})}
