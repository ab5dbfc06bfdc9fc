"""The store's admin plane: databases, their `_security`, accounts, node configuration and
design documents. Used by set-up and checks only (aso.provision.designdocs,
aso.provision.store_check, the local
stores, the CLI); agents and the front end use the data plane (aso.store)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote

from aso.store.api import EMBEDDED, Forbidden, StoreError, content_signature
from aso.store.couchapi import Database, Server, Settings


def membership(server: Server) -> dict[str, Any]:
    """`GET /_membership`: {all_nodes, cluster_nodes} (EMBEDDED_SINGLE_NODE)."""
    return cast(dict[str, Any], server.raw("GET", "/_membership"))


def cluster_size(server: Server) -> int:
    """Nodes of the cluster (1: a single CouchDB node or the embedded store)."""
    if server.kind == EMBEDDED:
        return 1  # EMBEDDED_SINGLE_NODE
    return max(1, len(membership(server).get("cluster_nodes", [])))


def node_config(server: Server, node: str = "_local") -> dict[str, dict[str, str]]:
    """The configuration of one node, {section: {key: value}} (server admin only;
    EMBEDDED_CONFIG_PATH: the embedded store has one, whatever `node` says)."""
    return cast(dict[str, dict[str, str]], server.raw("GET", _config_path(server, node)))


def _config_path(server: Server, node: str) -> str:
    if server.kind == EMBEDDED:
        return "/_config"
    return f"/_node/{quote(node, safe='')}/_config"


def all_dbs(server: Server) -> list[str]:
    return cast(list[str], server.call(server.client.get_all_dbs))


def create_db(
    server: Server, name: str, security: Mapping[str, Any], *, q: int | None = None
) -> bool:
    """Create database `name` (False if it existed) and set its `_security` either way.
    `q`: its shards, on a CouchDB cluster (a single node and the embedded store keep
    their default; a database's q is fixed when it is created)."""
    if not server.is_admin():
        # EMBEDDED_CRASH_ON_NON_ADMIN_DB_CREATE: never send the request that kills the server.
        raise Forbidden(403, "forbidden", f"creating database {name} needs the admin account")
    params = {"q": q} if q and cluster_size(server) > 1 else {}
    try:
        server.raw("PUT", f"/{quote(name, safe='')}", params=params)
        created = True
    except StoreError as exc:
        if exc.status != 412:
            raise
        created = False
    # EMBEDDED_OPEN_SECURITY: a database is never left with the store's default _security.
    set_security(server.db(name), security)
    return created


def compact(db: Database) -> None:
    """`POST /db/_compact`: the bodies of a database's old revisions dropped (CouchDB starts
    it and answers 202; the embedded store answers once it is done). A server admin's."""
    db.server.raw("POST", f"/{quote(db.name, safe='')}/_compact", body={})


def delete_db(server: Server, name: str) -> None:
    server.call(server.client.delete_database, db=name)


def set_server_admin(server: Server, name: str, password: str) -> None:
    """Create or change a server admin (EMBEDDED_CONFIG_PATH)."""
    server.raw(
        "PUT", f"{_config_path(server, '_local')}/admins/{quote(name, safe='')}", body=password
    )


def put_user(server: Server, name: str, password: str, roles: Sequence[str]) -> bool:
    """Create or update a store account in `_users`; True if something changed."""
    users = server.db("_users")
    doc_id = f"org.couchdb.user:{name}"
    current = users.get(doc_id)
    wanted = {"_id": doc_id, "name": name, "type": "user", "roles": sorted(roles)}
    same_roles = current is not None and sorted(current.get("roles", [])) == wanted["roles"]
    if same_roles and _password_works(server, name, password):
        return False
    if current:
        wanted["_rev"] = current["_rev"]
    wanted["password"] = password
    users.put(wanted)
    return True


def _password_works(server: Server, name: str, password: str) -> bool:
    probe = Server(server.url, name, password, Settings(retries=0))
    try:
        return probe.session().get("name") == name
    except StoreError:
        return False


def security(db: Database) -> dict[str, Any]:
    return cast(dict[str, Any], db.server.call(db.client.get_security, db=db.name))


def set_security(db: Database, wanted: Mapping[str, Any]) -> None:
    """Replace the database's `_security` (its admins: server admins and the database's
    own admins). Sent once, without the retries of a 5xx: COUCHDB_SECURITY_NO_MAJORITY."""
    body = {
        part: {
            "names": list(wanted.get(part, {}).get("names", [])),
            "roles": list(wanted.get(part, {}).get("roles", [])),
        }
        for part in ("admins", "members")
    }
    path = f"/{quote(db.name, safe='')}/_security"
    try:
        db.server.raw("PUT", path, body=body, client=db.server.single_shot_client)
    except StoreError as exc:
        if exc.status == 500 and exc.reason == "no_majority" and not _administered_by_me(db):
            raise Forbidden(
                403, "forbidden", f"only admins of {db.name} set its _security", exc.url
            ) from None
        raise


def _administered_by_me(db: Database) -> bool:
    """Whether this account is a server admin or an admin of this database."""
    try:
        ctx = db.server.session()
        if "_admin" in (ctx.get("roles") or []):
            return True
        admins = security(db).get("admins", {})
    except StoreError:
        return False
    roles = set(ctx.get("roles") or [])
    return ctx.get("name") in admins.get("names", []) or bool(roles & set(admins.get("roles", [])))


def push_design(db: Database, ddoc: Mapping[str, Any]) -> bool:
    """Write a design document unless the store already has the same one; True if written.

    The comparison is by content signature, so a push of unchanged files makes no new
    revision (a new revision would make every store re-check its view indexes).
    """
    body = _design_body(ddoc)
    signature = content_signature(body)
    name = ddoc["_id"].removeprefix("_design/")
    current = db.get(ddoc["_id"])
    if current and current.get("aso_signature") == signature:
        return False
    body["aso_signature"] = signature
    kwargs = {"rev": current["_rev"]} if current else {}
    db.server.call(
        db.client.put_design_document, db=db.name, ddoc=name, design_document=body, **kwargs
    )
    return True


def design_signature(ddoc: Mapping[str, Any]) -> str:
    """The `aso_signature` `push_design` stores with a design document: a stored one
    whose signature is that of the wanted one is up to date."""
    return content_signature(_design_body(ddoc))


def _design_body(ddoc: Mapping[str, Any]) -> dict[str, Any]:
    """A design document as it is signed and written: no revision, no signature."""
    return {k: v for k, v in ddoc.items() if k not in ("_rev", "aso_signature")}
