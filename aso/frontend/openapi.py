"""docs/openapi.yaml, generated: what the X.509 front end serves users, from its route table
(aso/frontend/routes.py) and the transfer request's schema (aso/model.py). `python -m
aso.frontend.openapi > docs/openapi.yaml` after a change of either; a test keeps the file equal
to what this makes.

The paths are the routes served to users (aso-user), for the default config's database names;
each operation's parameters and body are the route's, with their bounds, and `x-aso-audiences`
says who else it is served to. The routes served to agents and operators only are listed with
the users' in docs/security.md (`python -m aso.frontend.openapi --routes`). The model's checks
that JSON Schema cannot say (string lengths in UTF-16 units, integers past 2^53, the document's
size, the creation and transition rules) are the store's validation's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from aso import limits, model, upload
from aso.config import Config
from aso.frontend import routes
from aso.frontend.routes import Route


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
        if spec.get("max_chars"):  # no JSON Schema keyword bounds a value's serialised size
            out["description"] = f"at most {spec['max_chars']} characters as JSON"
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


def stored(spec: dict[str, Any], id_pattern: str, id_says: str) -> dict[str, Any]:
    """A model's schema as JSON Schema, with the store's members `_id` and `_rev`."""
    schema = json_schema(spec)
    schema["properties"] = {
        "_id": {"type": "string", "pattern": id_pattern, "description": id_says},
        "_rev": {"type": "string", "pattern": routes.REV_PATTERN,
                 "description": "the revision an update is based on"},
        **schema["properties"],
    }  # fmt: skip
    schema["required"] = ["_id", *schema["required"]]
    return schema


def transfer_request() -> dict[str, Any]:
    """components/schemas/TransferRequest: the model's schema with the store's members."""
    return stored(model.REQUEST_SCHEMA, model.DOC_ID_PATTERN, "sha256 of source_lfn, hex")


def hold() -> dict[str, Any]:
    """components/schemas/Hold: a hold document (aso/core/holds.py) with the store's members."""
    schema = stored(model.HOLD_SCHEMA, model.HOLD_ID_PATTERN, "hold:SITE:USER or hold:SITE")
    schema["description"] = (
        "A destination that refused its user's files for room or permission: the agents start, "
        "check and end it; its user may set `state` to released or cancelled while it is "
        'active, adding that entry to `history` (docs/status-api.md, "Held files")'
    )
    return schema


def subscription() -> dict[str, Any]:
    """components/schemas/Subscription: a user's subscription to notices (`aso notify`)."""
    schema = stored(model.SUBSCRIPTION_SCHEMA, model.NOTIFY_ID_PATTERN, "notify:<its user>")
    targets = schema["properties"]["targets"]["items"]["properties"]
    targets["to"]["description"] = (
        f"kind mail: one address ({model.MAIL_PATTERN}); webhook, mattermost: an http(s) "
        f"address ({model.WEBHOOK_PATTERN}); told only when the operator allows it"
    )
    schema["description"] = (
        "Where and of what the notifier tells its user: their holds' events and their tasks "
        'whose transfers are all over (docs/usage.md, "Notifications"). Written by its user '
        "(`by` their name, `updated` the store's time) or an operator; read by its user alone."
    )
    return schema


USER_DOCUMENT = {
    "description": "what a user writes by id: a transfer request, or a hold on their files",
    "oneOf": [{"$ref": "#/components/schemas/TransferRequest"},
              {"$ref": "#/components/schemas/Hold"}],
}  # fmt: skip


# -- the description -----------------------------------------------------------------------------
INFO = {
    "title": "ASO front end",
    "version": "2",
    "summary": "What users and CRAB-style clients reach through ASO's X.509 front end.",
    "description": (
        "The front end (`aso frontend`, aso/frontend/server.py) is a TLS front end to the document "
        "store, which speaks the Apache CouchDB 3 HTTP API. Every request needs a client "
        "certificate or RFC 3820 proxy of a trusted CA whose DN the grid-mapfile maps to an ASO "
        "user (roles aso-user, aso-agent, aso-admin); the store then sees that user and no "
        "other.\n\nDeny by default: these operations are the routes the front end serves users "
        "(aso/frontend/routes.py, from which this file is generated by "
        "`python -m aso.frontend.openapi`); "
        "anything else is refused with a 4xx and the reason (docs/security.md). Each request is "
        "parsed into its typed form (path segments, each query parameter, the body) and the "
        "store request is made anew from it. What each user may write is then decided by the "
        'files database\'s validate_doc_update (docs/design.md, "The transfer request"); '
        'refusals are CouchDB-style `{"error", "reason"}` answers.\n\n`TransferRequest` is '
        "generated from aso/model.py. The checks JSON Schema cannot express (lengths in UTF-16 "
        "units, integers past 2^53, the document's size of 256 KiB, the request id being the "
        "sha256 of its source LFN, creation and transition rules, who may write what) are the "
        "store's."
    ),
}
ERROR = {"$ref": "#/components/responses/Refused"}
REFUSALS = {code: ERROR for code in ("400", "401", "403", "404", "405", "413")}
# A write's refusal's stable code (docs/status-api.md, "Codes"): what a client acts on.
CODE = {
    "type": "string",
    "description": "on a write's 403 the rule that refused it (`schema`, `transition`, "
    "`namespace`, ..., the `[rule]` its reason begins with); on a 409 the case: "
    + ", ".join(f"`{code}` ({says})" for code, says in upload.CONFLICT_CODES.items())
    + ", or `conflict` (based on a stale `_rev`: read the document again)",
}
SCHEMAS: dict[str, Any] = {
    "TaskKey": {
        "description": "A by_task key, [task, job, file_type, request id]: unique, jobs in "
        "numeric order (a job id of digits is a number in the key; any other job id is text, "
        "after the numbers).",
        "type": "array",
        "prefixItems": [
            {"type": "string"},
            {"type": ["integer", "string"]},
            {"type": "string"},
            {"type": "string"},
        ],
        "maxItems": 4,
    },
    "StatusRow": {
        "description": 'What a client shows of one file (docs/status-api.md, "Reading a task").',
        "type": "object",
        "additionalProperties": False,
        "required": [
            "rev",
            "job_id",
            "job_retry",
            "user",
            "state",
            "cleanup",
            "publication",
            "source",
            "destination",
            "source_lfn",
            "destination_lfn",
            "size",
            "attempts",
            "error_class",
            "reason",
            "cleanup_error",
            "publication_error",
            "created",
            "last_update",
            "waiting",
            "final",
            "note",
        ],
        "properties": {
            "rev": {
                "type": "string",
                "description": "the document's revision: the same rev twice is the same state",
            },
            "job_id": {"type": "string"},
            "job_retry": {"type": "integer", "minimum": 0},
            "user": {"type": "string"},
            "state": {"$ref": "#/components/schemas/TransferRequest/properties/state"},
            "cleanup": {"$ref": "#/components/schemas/TransferRequest/properties/cleanup"},
            "publication": {"$ref": "#/components/schemas/TransferRequest/properties/publication"},
            "source": {"type": "string"},
            "destination": {"type": "string"},
            "source_lfn": {"type": "string"},
            "destination_lfn": {"type": "string"},
            "size": {"type": "integer", "minimum": 0},
            "attempts": {
                "type": "integer",
                "minimum": 0,
                "description": "transfer attempts so far",
            },
            "error_class": {
                "type": ["string", "null"],
                "description": "the current failure's "
                "class (failed_attempt, retry, failed, killed); null otherwise",
            },
            "reason": {"type": ["string", "null"], "description": "the current failure's reason"},
            "cleanup_error": {
                "type": ["string", "null"],
                "description": "the last deletion error while it stands",
            },
            "publication_error": {
                "type": ["string", "null"],
                "description": "the last publication error while it stands",
            },
            "created": {"type": "number", "description": "epoch seconds"},
            "last_update": {
                "type": "number",
                "description": "epoch seconds of the agent's clock: for people, not a cursor",
            },
            "waiting": {
                "type": ["object", "null"],
                "description": 'why a file not finished waits (docs/status-api.md, "Why a '
                'file waits"); null once it is finished, or stopped (failed, killed)',
                "additionalProperties": False,
                "required": ["why", "since", "until", "job_id"],
                "properties": {
                    "why": {
                        "enum": sorted(
                            {w for by in model.WAITING_WHY.values() for w in by.values()}
                            | {model.HELD}
                        )
                    },
                    "since": {
                        "type": "number",
                        "description": "epoch seconds: its last change on that axis",
                    },
                    "until": {
                        "type": ["number", "null"],
                        "description": "epoch seconds: the end of a cool-off or a retry's backoff",
                    },
                    "job_id": {
                        "type": ["string", "null"],
                        "description": "the job at the transfer service",
                    },
                    "hold": {
                        "type": "string",
                        "pattern": model.HOLD_ID_PATTERN,
                        "description": "held: the id of its hold (hold:SITE:USER), a document "
                        "its user reads and may release or cancel (docs/status-api.md, "
                        '"Held files")',
                    },
                },
            },
            "final": {
                "type": "boolean",
                "description": "finished for good: done with its temporary copy gone and its "
                "publication over, or failed or killed (never copied); nothing more happens "
                "to it unless its owner resubmits it",
            },
            "note": {
                "type": ["string", "null"],
                "description": "a file done although its owner killed it: the kill came too "
                "late, the copy had finished first (the reason of that change in its history)",
            },
        },
    },
    "Error": {
        "type": "object",
        "required": ["error", "reason"],
        "properties": {
            "error": {"type": "string"},
            "reason": {"type": "string"},
            "code": CODE,
        },
    },
    "WriteOk": {
        "type": "object",
        "required": ["ok", "id", "rev"],
        "properties": {"ok": {"const": True}, "id": {"type": "string"}, "rev": {"type": "string"}},
    },
    "WriteError": {
        "type": "object",
        "required": ["id", "error", "reason", "code"],
        "properties": {
            "id": {"type": "string"},
            "error": {"type": "string"},
            "reason": {"type": "string"},
            "code": CODE,
        },
    },
    "Session": {
        "type": "object",
        "required": ["ok", "userCtx"],
        "properties": {
            "ok": {"const": True},
            "userCtx": {
                "type": "object",
                "required": ["name", "roles"],
                "properties": {
                    "name": {"type": "string"},
                    "roles": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
    "ViewRows": {
        "type": "object",
        "required": ["rows"],
        "properties": {
            "total_rows": {"type": "integer"},
            "offset": {"type": ["integer", "null"]},
            "rows": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["key"],
                    "properties": {"id": {"type": "string"}, "key": {}, "value": {}, "doc": {}},
                },
            },
        },
    },
    "TaskRows": {
        "type": "object",
        "required": ["rows"],
        "properties": {
            "total_rows": {"type": "integer"},
            "offset": {"type": ["integer", "null"]},
            "rows": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "key", "value"],
                    "properties": {
                        "id": {"type": "string", "description": "the request id"},
                        "key": {"$ref": "#/components/schemas/TaskKey"},
                        "value": {"$ref": "#/components/schemas/StatusRow"},
                        "doc": {},
                    },
                },
            },
        },
    },
    "Changes": {
        "type": "object",
        "required": ["results", "last_seq"],
        "properties": {
            "results": {"type": "array", "items": {"type": "object"}},
            "last_seq": {"type": ["string", "integer"], "description": "the next `since`"},
            "pending": {"type": "integer"},
        },
    },
    "StoredRequest": {
        "description": "a stored request (TransferRequest with its revision)",
        "allOf": [{"$ref": "#/components/schemas/TransferRequest"}, {"required": ["_rev"]}],
    },
    "Document": {
        "type": "object",
        "required": ["_id"],
        "properties": {"_id": {"type": "string"}, "_rev": {"type": "string"}},
    },
}
CONFLICT = {
    "description": (
        "A request with this id exists. For a creation (a document without `_rev`) the front "
        "end compares the stored request with the one sent and says which case it is, so that "
        'no second request is needed (docs/status-api.md, "Recording a request"): `already '
        "recorded: the same file (nothing to do)` (the same LFNs, sites, size and checksum: a job "
        "that ran its stage-out twice), or a reason that begins `a different file` (a job retry's "
        "new file, or a wrong upload), saying whether a job retry may renew it, or `a request "
        "with this id exists and is another user's` (never `already recorded` for a request "
        "that is not the caller's). An update based on a stale `_rev` gets `Document update "
        "conflict.`: read the request again."
    ),
    "content": {
        "application/json": {
            "schema": {"$ref": "#/components/schemas/Error"},
            "examples": {
                "alreadyRecorded": {
                    "value": {
                        "error": "conflict",
                        "reason": upload.ALREADY_RECORDED,
                        "code": upload.SAME_FILE,
                    }
                },
                "differentFile": {
                    "value": {
                        "error": "conflict",
                        "reason": (
                            "a different file is recorded under this id (job retry 0, failed): "
                            "this job retry may renew it (docs/status-api.md, Job retries)"
                        ),
                        "code": upload.RENEWABLE,
                    }
                },
                "staleRevision": {
                    "value": {
                        "error": "conflict",
                        "reason": "Document update conflict.",
                        "code": "conflict",
                    }
                },
            },
        }
    },
}
RESPONSES = {
    "Written": {
        "description": "written",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/WriteOk"}}},
    },
    "Results": {
        "description": "one result per document (a refused one does not stop the "
        "others), matched by `id`: the embedded store does not answer in the documents' "
        "order. A creation's conflict has the reasons of `Conflict`.",
        "content": {
            "application/json": {
                "schema": {
                    "type": "array",
                    "items": {
                        "oneOf": [
                            {"$ref": "#/components/schemas/WriteOk"},
                            {"$ref": "#/components/schemas/WriteError"},
                        ]
                    },
                }
            }
        },
    },
    "Refused": {
        "description": "refused, with the reason (the front end's route table, "
        "validate_doc_update's rule, the store's)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    },
    "Conflict": CONFLICT,
}

# What a route answers when it serves, by the route's name (else by its kind, KIND_ANSWERS).
ANSWERS = {
    "session": "Session",
    "filesGet": "StoredRequest",
    "filesView_asyncstageout_by_task": "TaskRows",
    "filesViewPost_asyncstageout_by_task": "TaskRows",
}
KIND_ANSWERS = {"poll": "Changes", "read": "ViewRows"}


def _answer(route: Route) -> dict[str, Any]:
    if route.kind == "create":
        ok = "Results" if isinstance(route.body, routes.Bulk) else "Written"
        return {"201": {"$ref": f"#/components/responses/{ok}"},
                "409": {"$ref": "#/components/responses/Conflict"}}  # fmt: skip
    if route.tag == "pages" or route.name in ("welcome", "up", "filesInfo", "statsInfo"):
        return {"200": {"description": "the store's answer", "content": {"*/*": {"schema": {}}}}}
    if route.name.endswith("Get") or route.name.endswith("AllDocs") or "AllDocs" in route.name:
        name = ANSWERS.get(route.name, "ViewRows" if "AllDocs" in route.name else "Document")
    else:
        name = ANSWERS.get(route.name, KIND_ANSWERS.get(route.kind, "ViewRows"))
    schema = {"$ref": f"#/components/schemas/{name}"}
    return {"200": {"description": "served", "content": {"application/json": {"schema": schema}}}}


def _parameters(route: Route, shared: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The route's parameters: path variables inline, query parameters as references to
    components/parameters (`shared`, filled here), one per name and type."""
    out = [
        {"name": var.name, "in": "path", "required": True, "schema": var.value.schema(),
         "description": var.value.meaning}
        for var in route.path if isinstance(var, routes.Var)
    ]  # fmt: skip
    for name, value in route.query.items():
        param: dict[str, Any] = {"name": name, "in": "query", "schema": value.schema()}
        if isinstance(value, routes.Key | routes.Listed):
            param["content"] = {"application/json": {"schema": param.pop("schema")}}
        key = next((k for k, p in shared.items() if p == param), None)
        if key is None:
            key = name if name not in shared else f"{name}{sum(k.startswith(name) for k in shared)}"
            shared[key] = param
        out.append({"$ref": f"#/components/parameters/{key}"})
    return out


def operation(route: Route, shared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": route.name,
        "summary": route.summary,
        "tags": [route.tag],
        "x-aso-audiences": sorted(route.audiences),
    }
    if route.rules:
        op["description"] = "; ".join(
            f"{a} is not taken with {b[1:]}" if b.startswith("!") else f"{a} only with {b}"
            for a, b in route.rules
        )
    parameters = _parameters(route, shared)
    if parameters:
        op["parameters"] = parameters
    if route.body is not None:
        required = not isinstance(route.body, routes.Options)
        op["requestBody"] = {"required": required, "content": {
            "application/json": {"schema": route.body.schema()}}}  # fmt: skip
    op["responses"] = {**_answer(route), **REFUSALS}
    return op


def description(config: Config | None = None) -> dict[str, Any]:
    """The whole OpenAPI 3.1 document for `config` (default: the default config)."""
    config = config or Config()
    paths: dict[str, dict[str, Any]] = {}
    shared: dict[str, dict[str, Any]] = {}
    for route in routes.served_to(routes.table(config), routes.USER):
        paths.setdefault(route.template, {})[route.method.lower()] = operation(route, shared)
    return {
        "openapi": "3.1.0",
        "info": INFO,
        "servers": [{"url": "https://127.0.0.1:8443",
                     "description": "the front end of `make run` (frontend.listen)"}],
        "security": [{"x509": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"x509": {"type": "mutualTLS", "description": "a client "
                                "certificate or proxy; its DN must be in the grid-mapfile"}},
            "parameters": shared,
            "responses": RESPONSES,
            "schemas": {**SCHEMAS, "TransferRequest": transfer_request(), "Hold": hold(),
                        "UserDocument": USER_DOCUMENT, "Subscription": subscription()},
        },
    }  # fmt: skip


HEADER = (
    "# Generated by `python -m aso.frontend.openapi` from aso/frontend/routes.py and "
    "aso/model.py.\n"
)


def render(config: Config | None = None) -> str:
    # The generator's own need (a test and a developer run it), not the service's; no stubs.
    import yaml  # type: ignore[import-untyped]

    class Dumper(yaml.SafeDumper):  # type: ignore[misc]
        def ignore_aliases(self, data: Any) -> bool:
            return True  # the same schema twice is written twice: no anchors to follow

    text = yaml.dump(description(config), Dumper=Dumper, sort_keys=False, width=100,
                     allow_unicode=True, default_flow_style=None)  # fmt: skip
    return HEADER + str(text)


def route_table(config: Config | None = None) -> str:
    """docs/security.md's tables: every route, who it is served to and what it takes; and each
    query parameter's type and bounds."""
    table = routes.table(config or Config())
    lines = ["| method | path | served to | query parameters | body |", "|---|---|---|---|---|"]
    kinds: dict[str, set[str]] = {}
    for route in table:
        for name, value in route.query.items():
            kinds.setdefault(name, set()).add(routes.describe(value))
        query = ", ".join(f"`{n}`" for n in route.query) or "none"
        audiences = ", ".join(sorted(route.audiences))
        lines.append(f"| {route.method} | `{route.template}` | {audiences} | {query} | "
                     f"{_body_words(route)} |")  # fmt: skip
    lines += ["", "| query parameter | takes |", "|---|---|"]
    lines += [f"| `{name}` | {'; or '.join(sorted(kinds[name]))} |" for name in sorted(kinds)]
    return "\n".join(lines) + "\n"


def _body_words(route: Route) -> str:
    body = route.body
    if body is None:
        return "none"
    if isinstance(body, routes.Bulk):
        return f"up to {limits.MAX_DOCS} documents ({_doc_words(body.doc)}), each id once"
    if isinstance(body, routes.Document):
        return _doc_words(body)
    if isinstance(body, routes.Options):
        return "an object of its parameters: " + ", ".join(f"`{n}`" for n in body.params)
    return type(body).__name__


def _doc_words(doc: routes.Document) -> str:
    ids = "request id" if doc.ids is routes.REQUEST_ID else "document id"
    members = ", ".join(f"`{m}`" for m in doc.members)
    return f"a {ids}; of the store's members {members}; at most {doc.max_chars} characters"


if __name__ == "__main__":
    if sys.argv[1:] == ["--routes"]:
        print(route_table(), end="")
    elif sys.argv[1:] == ["--schema"]:
        print(json.dumps(transfer_request(), indent=2, ensure_ascii=False))
    else:
        print(render(), end="")
