"""The model and the config on their own (no store): ids, schema, transitions, config keys."""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aso import config as aso_config
from aso import model, upload
from aso.model import ADMIN, AGENT, OWNER, STATE, Change
from aso.provision import designdocs
from aso.provision.storejs import granted_groups, in_temp_area, owner_refusal
from aso.upload import judged_request
from tests import storejs
from tests.conftest import sample_request

DOCS = Path(__file__).resolve().parent.parent / "docs"
CONFIGURATION_DOC = DOCS / "configuration.md"  # the config key table
DESIGN_DOC = DOCS / "design.md"  # the transition table


def test_request_id_is_deterministic_hash_of_source_lfn():
    a = sample_request("alice")
    again = judged_request(
        user="alice",
        task=a["task"],
        job_id=a["job_id"],
        source=a["source"],
        destination=a["destination"],
        source_lfn=a["source_lfn"],
        destination_lfn=a["destination_lfn"],
        size=a["size"],
        adler32="a1b2c3d",
    )
    assert again["_id"] == a["_id"] == model.request_id(a["source_lfn"])
    assert re.fullmatch(model.DOC_ID_PATTERN, a["_id"])
    assert again["checksum"] == {"adler32": "0a1b2c3d"}  # normalised: 8 lower-case hex digits


def test_a_judged_request_records_its_creation():
    doc = sample_request("alice", at=1700000000.0)
    assert doc["state"] == "new" and doc["cleanup"] == "pending"
    assert doc["publication"] == "not_required"
    assert doc["history"] == [
        {"axis": "state", "from": None, "to": "new", "at": 1700000000.0, "by": "alice"}
    ]
    assert doc["created"] == doc["last_update"] == 1700000000.0
    log = sample_request(
        "alice", file_type="log", publish=True, publish_info={"dataset": "/a/b-c/USER"}
    )
    assert log["publication"] == "not_required"  # logs are never published


def test_transition_appends_history_and_checks_the_role():
    doc = sample_request("alice")
    submitted = model.transition(
        doc,
        [Change(STATE, "submitted", "submitter@h:1")],
        AGENT,
        at=5.0,
        lease={"owner": "submitter@h:1", "until": 9.0},
    )
    assert submitted["state"] == "submitted" and submitted["last_update"] == 5.0
    assert submitted["history"][-1] == {
        "axis": "state",
        "from": "new",
        "to": "submitted",
        "at": 5.0,
        "by": "submitter@h:1",
    }
    assert doc["state"] == "new" and len(doc["history"]) == 1  # the input is untouched
    with pytest.raises(model.TransitionError, match="owner may not change state"):
        model.transition(doc, [Change(STATE, "submitted", "alice")], OWNER)
    with pytest.raises(model.TransitionError, match="cleanup may only change while state"):
        model.transition(doc, [Change("cleanup", "cleaned", "c")], AGENT)
    with pytest.raises(model.TransitionError, match="has no state"):
        model.transition(doc, [Change(STATE, "flying", "x")], ADMIN)
    failed = model.transition(doc, [Change(STATE, "killed", "alice", reason="x" * 9000)], OWNER)
    assert len(failed["history"][-1]["reason"]) == 4096
    storejs.check_schema(failed)


def test_transition_table_is_closed_over_the_states():
    for axis, table in model.TRANSITIONS.items():
        for (old, new), roles in table.items():
            assert old in model.STATES[axis] and new in model.STATES[axis], (axis, old, new)
            assert roles and roles <= {OWNER, AGENT}
    # Every non-final state has a way out for some role; final ones only by the user's hand.
    for state in model.STATES[STATE]:
        exits = [b for (a, b) in model.TRANSITIONS[STATE] if a == state]
        assert exits or state in model.FINAL[STATE], state


def test_validation_model_is_json_and_complete():
    import json

    data = json.loads(json.dumps(model.validation_model()))
    assert set(data["transitions"]) == set(model.AXES)
    assert data["transitions"]["state"]["new>submitted"] == ["agent"]


def test_role_of():
    doc = {"user": "alice"}
    assert model.role_of({"name": "x", "roles": ["_admin"]}, doc) == ADMIN
    assert model.role_of({"name": "x", "roles": ["aso-admin"]}, doc) == ADMIN
    assert model.role_of({"name": "x", "roles": ["aso-agent"]}, doc) == AGENT
    assert model.role_of({"name": "alice", "roles": ["aso-user"]}, doc) == OWNER
    assert model.role_of({"name": "bob", "roles": ["aso-user"]}, doc) is None
    assert model.role_of({"name": None, "roles": []}, doc) is None


# --- config ----------------------------------------------------------------------------------
def test_defaults_without_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ASO_CONFIG", raising=False)
    monkeypatch.setattr(aso_config, "SEARCH_PATHS", (Path("aso.toml"),))
    config = aso_config.load()
    assert config.source is None
    assert config.store.url == "http://127.0.0.1:5984"
    assert config.path(config.embedded.data_dir) == tmp_path / "var" / "store"


def test_relative_paths_are_relative_to_the_file(tmp_path):
    path = tmp_path / "etc" / "aso.toml"
    path.parent.mkdir()
    path.write_text('[embedded]\ndata_dir = "../data"\n[store]\nretries = 3\nbackoff = 1\n')
    config = aso_config.load(str(path))
    assert config.path(config.embedded.data_dir) == tmp_path / "data"
    assert config.store.retries == 3 and config.store.backoff == 1.0


def test_env_variable_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "x.toml"
    path.write_text('[store]\nfiles_db = "other"\n')
    monkeypatch.setenv("ASO_CONFIG", str(path))
    assert aso_config.load().store.files_db == "other"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[stor]\nurl = 'http://x'\n", "unknown key 'stor' (did you mean 'store'?)"),
        ("[store]\nretries = true\n", "store.retries: expected int, got bool"),
        ("[store]\nurl = 'ftp://x'\n", "store.url must be an http:// or https:// URL"),
        ("[log]\nlevel = 'LOUD'\n", "log.level must be"),
        ("store = 3\n", "[store] must be a table"),
        ("[store]\npool_size = 0\n", "store.pool_size is out of range"),
        ("[publisher]\nblocks_per_call = 0\n", "publisher.blocks_per_call must be between 1"),
    ],
)
def test_bad_config_values(tmp_path, text, message):
    path = tmp_path / "aso.toml"
    path.write_text(text)
    with pytest.raises(aso_config.ConfigError) as err:
        aso_config.load(str(path))
    assert message in str(err.value)


def test_new_config_round_trips_with_generated_passwords(tmp_path):
    path = tmp_path / "aso.toml"
    aso_config.write_new_config(path)
    config = aso_config.load(str(path))
    assert len(config.store.admin_password) >= 20 and config.store.agent_password
    assert config.store.admin_password != config.store.agent_password


def test_configuration_doc_documents_every_key_with_its_default():
    text = CONFIGURATION_DOC.read_text()
    for key, default, _doc in aso_config.describe():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{key}` ")), None)
        assert row is not None, f"docs/configuration.md has no row for {key}"
        shown = f'`"{default}"`' if isinstance(default, str) else f"`{default}`"
        assert shown in row, f"docs/configuration.md row of {key} does not show its default {shown}"
    assert aso_config.markdown_table() in text  # regenerate: aso config keys --markdown


def test_design_doc_transition_table_is_the_models():
    rows = re.findall(
        r"^\| (state|cleanup|publication) \| `(\w+)` → `(\w+)` \| ([\w, ]+) \|$",
        DESIGN_DOC.read_text(),
        flags=re.MULTILINE,
    )
    documented = {
        (axis, a, b): frozenset(r.strip() for r in roles.split(",")) for axis, a, b, roles in rows
    }
    actual = {
        (axis, a, b): roles
        for axis, table in model.TRANSITIONS.items()
        for (a, b), roles in table.items()
    }
    assert documented == actual


UPLOAD_FAULTS = [
    ("a field off the schema", lambda d: d.update(colour="red")),
    ("a size that is no integer", lambda d: d.update(size=1.5)),
    ("an id of another file", lambda d: d.update(_id="0" * 64)),
    ("an LFN with a .. part", lambda d: d.update(destination_lfn="/store/user/alice/../bob/f")),
    ("publish without publish_info", lambda d: d.update(publish=True, file_type="output")),
]


@pytest.mark.parametrize(("case", "edit"), UPLOAD_FAULTS, ids=[f[0] for f in UPLOAD_FAULTS])
def test_an_upload_is_judged_by_the_store_s_own_schema(case, edit):
    """An upload's documents are judged before they are sent by couchapp/'s lib/schema.js (run
    in QuickJS), the file validate_doc_update requires: the same refusal, in the same words,
    as the store gives an admin (whom only the schema binds)."""
    doc = sample_request("alice")
    assert upload.refusal(doc) is None
    edit(doc)
    if case.startswith("publish"):
        doc.pop("publish_info", None)
    with pytest.raises(model.Refusal) as store:
        storejs.validate_doc_update(doc, None, {"name": "admin", "roles": ["_admin"]})
    assert store.value.rule == "schema"
    assert upload.refusal(doc) == store.value.reason


def files_design_edited(tmp_path: Path, lib: str, old: str, new: str) -> storejs.DesignDocument:
    """The files design document built from a copy of couchapp/ whose lib/`lib` has `old`
    replaced by `new`."""
    root = tmp_path / "couchapp"
    shutil.copytree(designdocs.COUCHAPP_DIR, root)
    edited = root / "asyncstageout/lib" / lib
    edited.write_text(edited.read_text().replace(old, new))
    [ddoc] = [d for d in designdocs.design_documents(aso_config.Config(), root)
              if d["_id"] == storejs.FILES_DDOC]  # fmt: skip
    return storejs.DesignDocument(ddoc)


def test_the_schema_is_run_from_the_design_document_s_file(tmp_path):
    """Change lib/schema.js and the judgement changes: no copy of the rule is kept elsewhere."""
    edited = files_design_edited(
        tmp_path, "schema.js", "' is not a field of the schema'", "' is off'"
    )
    doc = dict(sample_request("alice"), colour="red")
    changed = edited.check_request(json.dumps(doc), True)
    assert changed is not None and changed.reason == "[schema] doc.colour is off"
    assert upload.refusal(doc) == "[schema] doc.colour is not a field of the schema"


def test_what_a_user_owns_is_judged_by_the_design_document_s_file(tmp_path):
    """lib/owner.js is the one source of what a user owns: ASO's Python (an upload's task and
    priority, the front end's group roles, the deleter's temporary area) runs that file, so a
    change to it changes every judgement."""
    doc = sample_request("alice")
    theirs = dict(doc, task=model.task_name("bob", "crab_x"))
    assert owner_refusal(doc) is None
    refused = owner_refusal(theirs)
    assert refused is not None and refused.rule == "task"
    with pytest.raises(model.Refusal) as store:
        storejs.validate_doc_update(theirs, None, {"name": "alice", "roles": ["aso-user"]})
    assert store.value.reason == refused.reason
    high = owner_refusal(dict(doc, priority=1))
    assert high is not None and (high.rule, high.reason) == (
        "create",
        "[create] priority must be <= 0: an owner may only lower their own files' priority (a "
        "higher one is an operator's)",
    )
    assert granted_groups(["aso-user", "group:higgs", "group:", 7]) == ["higgs"]
    assert in_temp_area("alice", "/store/temp/user/alice.1a2b/f")
    assert not in_temp_area("alice", "/store/temp/user/alicex/f")

    edited = files_design_edited(tmp_path, "owner.js", "if (taskOwner(task) === name)", "if (true)")
    assert edited.ownership("taskRefusal", theirs["task"], "alice") is None


def test_uploads_are_judged_from_many_threads_at_once():
    """The simulator's uploaders judge their uploads from eight threads: QuickJS is entered by
    one at a time (two in it at once had aborted the process)."""
    doc = sample_request("alice")
    wrong = dict(doc, colour="red")

    def judge(_: int) -> tuple[str | None, str | None]:
        return upload.refusal(doc), upload.refusal(wrong)

    with ThreadPoolExecutor(8) as pool:
        verdicts = set(pool.map(judge, range(400)))
    assert verdicts == {(None, "[schema] doc.colour is not a field of the schema")}


def test_every_file_not_finished_has_a_reason_to_wait_and_words_for_it():
    """model.WAITING_WHY names a reason for every state on its way and every due publication
    and cleanup of a copied file; each reason (and held_back) has its words, which `aso status`
    can list with ";" and ","."""
    assert set(model.WAITING_WHY[model.STATE]) == set(model.ON_ITS_WAY)
    assert set(model.WAITING_WHY[model.PUBLICATION]) == set(model.PUBLICATION_DUE)
    assert set(model.WAITING_WHY[model.CLEANUP]) == set(model.CLEANUP_DUE)
    reasons = {why for by in model.WAITING_WHY.values() for why in by.values()}
    assert len(reasons) == sum(len(by) for by in model.WAITING_WHY.values())  # each its own
    assert set(model.WAITING_WORDS) == reasons | {model.HELD_BACK, model.HELD}
    assert not any("," in words or ";" in words for words in model.WAITING_WORDS.values())


def test_an_agent_a_file_does_not_name_runs_its_default_count(tmp_path):
    """Round 29: a config written before the hold checker existed named seven agents in
    [agents.instances], which replaced the built-in table: `aso run` never started the hold
    checker, and no hold was looked at again. Agents a file does not name run their default."""
    path = tmp_path / "aso.toml"
    path.write_text("[agents.instances]\nsubmitter = 2\nreconciler = 0\n")
    instances = aso_config.load(str(path)).agents.instances
    assert instances["submitter"] == 2 and instances["reconciler"] == 0
    assert instances["hold-checker"] == 1 and instances["monitor"] == 1
