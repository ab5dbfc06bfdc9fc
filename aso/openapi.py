"""The transfer request as JSON Schema, for docs/openapi.yaml (the front end's API description).

docs/openapi.yaml carries this schema under components/schemas/TransferRequest; a test checks that
it is still what aso/model.py says, so the description cannot drift from the model. Print it
with `python -m aso.openapi` after a change of the model.

The model's checks that JSON Schema cannot say (string lengths in UTF-16 units, integers past
2^53, the document's size, the creation and transition rules) are the store's: the description
says what a well-formed request looks like, validate_doc_update decides the rest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aso import model


def json_schema(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One field spec of aso/model.py as JSON Schema (2020-12, as OpenAPI 3.1 takes it)."""
    types = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
    out: dict[str, Any] = {"type": types[0] if len(types) == 1 else list(types)}
    if "enum" in spec:
        out["enum"] = list(spec["enum"])
    if "string" in types:
        out["maxLength"] = spec.get("max") or model.MAX_STRING
        if spec.get("min_length"):
            out["minLength"] = spec["min_length"]
        if "pattern" in spec:
            out["pattern"] = spec["pattern"]
    if {"integer", "number"} & set(types):
        if "min" in spec:
            out["minimum"] = spec["min"]
        if "max_value" in spec:
            out["maximum"] = spec["max_value"]
    if "array" in types:
        out["maxItems"] = spec.get("max_items") or 1000
        out["items"] = json_schema(spec["items"])
    if "object" in types:
        out.update(_object(spec))
    return out


def _object(spec: Mapping[str, Any]) -> dict[str, Any]:
    if "values" in spec:
        return {
            "maxProperties": spec.get("max_keys") or 1000,
            "additionalProperties": json_schema(spec["values"]),
        }
    out: dict[str, Any] = {
        "properties": {name: json_schema(field) for name, field in spec.get("fields", {}).items()},
        "additionalProperties": False,
    }
    if spec.get("required"):
        out["required"] = list(spec["required"])
    return out


def transfer_request() -> dict[str, Any]:
    """components/schemas/TransferRequest: the model's schema with the store's members."""
    schema = json_schema(model.REQUEST_SCHEMA)
    schema["properties"] = {
        "_id": {"type": "string", "pattern": model.DOC_ID_PATTERN,
                "description": "sha256 of source_lfn, hex"},
        "_rev": {"type": "string", "description": "the revision an update is based on"},
        **schema["properties"],
    }  # fmt: skip
    schema["required"] = ["_id", *schema["required"]]
    return schema


if __name__ == "__main__":
    print(json.dumps(transfer_request(), indent=2, ensure_ascii=False))
