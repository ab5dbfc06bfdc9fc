function (newDoc, oldDoc, userCtx, secObj) {
  // The one authority on what may be written to the files database.
  // The tables (schema, states, transitions, roles) are aso/model.py's, pushed by `aso db init`
  // into this design document as lib/model. ES5 only: CouchDB's JavaScript engine and the
  // embedded store's must both run it. userCtx.db and secObj are not read: the embedded store
  // does not fill them (docs/store-quirks.md, EMBEDDED_USERCTX_HAS_NO_DB).
  var model = require('lib/model');
  // The sites of this ASO's catalogue (aso/provision/designdocs.py sites_module).
  var sites = require('lib/sites').names;
  // The request id of a source LFN (aso/model.py request_id; lib/sha256.js beside this file).
  var sha256 = require('lib/sha256').hex;

  // The schema's checks (lib/schema.js), shared with ASO's Python.
  var schema = require('lib/schema')(model, sha256);
  var refuse = schema.refuse, has = schema.has, typeOf = schema.typeOf;
  // What a user owns: namespaces, tasks, priority (lib/owner.js), shared with ASO's Python.
  var ownership = require('lib/owner')(model);

  function hasRole(roles) {
    var mine = userCtx.roles || [];
    for (var i = 0; i < roles.length; i++) {
      if (mine.indexOf(roles[i]) !== -1) { return true; }
    }
    return false;
  }

  function same(a, b) {
    if (a === b) { return true; }
    var ta = typeOf(a);
    if (ta !== typeOf(b) || (ta !== 'array' && ta !== 'object')) { return false; }
    if (ta === 'array') {
      if (a.length !== b.length) { return false; }
      for (var i = 0; i < a.length; i++) { if (!same(a[i], b[i])) { return false; } }
      return true;
    }
    var key;
    for (key in a) { if (has(a, key) && (!has(b, key) || !same(a[key], b[key]))) { return false; } }
    for (key in b) { if (has(b, key) && !has(a, key)) { return false; } }
    return true;
  }

  // Where a request's files and dataset lie is judged on every write that sets them, by the
  // owner's namespace: a creation, or the owner's renewal (RENEWABLE). Nobody else sets them.
  function checkNamespaces(role) {
    var fields = model.namespaced, changed = !oldDoc, i;
    for (i = 0; oldDoc && i < fields.length; i++) {
      if (!same(newDoc[fields[i]], oldDoc[fields[i]])) { changed = true; }
    }
    if (!changed) { return; }
    if (role !== 'owner') { refuse('immutable', fields.join(', ') + ' are set by the owner only'); }
    var outside = ownership.namespaceRefusal(newDoc, userCtx.name, userCtx.roles);
    if (outside) { refuse('namespace', outside); }
  }

  // A write must be based on the current revision `parent` (a creation: on none, or on the
  // deleted document's). The embedded store asks this function about writes based on any
  // revision, judged against the current one, before it looks for a conflict, and then stores
  // them on the revision they name, even one made earlier in the same batch; a replicated write
  // (new_edits=false) is asked about with an older revision or none, on either store
  // (EMBEDDED_VALIDATES_BEFORE_CONFLICT). Refused here, such a write is never stored unjudged;
  // CouchDB answers a plain stale write 409 first, and "[conflict] " makes this refusal that
  // 409 for every client (aso/store/).
  function checkCurrent(parent) {
    var rev = newDoc._rev;
    var live = parent && !parent._deleted;
    if (parent ? rev === parent._rev || (!live && rev === undefined) : rev === undefined) { return; }
    if (!live) {
      refuse('conflict', 'the write is based on revision ' + JSON.stringify(rev) + ' of a document that does not exist: a creation has no _rev');
    }
    if (rev === undefined) {
      refuse('conflict', 'a document with this id exists (revision ' + parent._rev + '): read it, not create it again');
    }
    refuse('conflict', 'the write is based on revision ' + JSON.stringify(rev) + ', not on the current ' + parent._rev + ': read the document again');
  }

  // What an owner writes is the store's time, give or take (aso/model.py CLOCK_AHEAD,
  // CLOCK_BEHIND): a job's clock may be off by minutes, not years.
  function stampRefusal(field, stamp) {
    var now = Date.now() / 1000;
    if (stamp <= now + model.clock_ahead && stamp >= now - model.clock_behind) { return null; }
    return field + " must be the store's time: at most " + model.clock_ahead + ' seconds ahead ' +
      'of its clock and ' + model.clock_behind + ' seconds behind it';
  }

  // The owner's history entries carry what the owner knows: no cool-off of the retry manager.
  function checkOwnerEntry(entry) {
    if (has(entry, 'until')) { refuse('history', "until is the retry manager's: an owner's history entry has none"); }
  }

  // Publication is pending only for an output file to publish (aso/model.py publication_refusal).
  function publicationRefusal(doc) {
    var intent = doc.publish === true && doc.file_type === 'output' ? 'pending' : 'not_required';
    if (doc.publication === intent) { return null; }
    return 'publication must be ' + intent + ', not ' + doc.publication + ' (pending only for ' +
      'an output file with publish true and its dataset)';
  }

  // At creation the owner records what a job knows (aso/model.py BOOKKEEPING, OWNER_RECORDED):
  // nothing an agent acts on, a priority of at most the owner's, one stamp of the store's time.
  function checkOwnerCreation(doc, entry) {
    var publication = publicationRefusal(doc), field;
    if (publication) { refuse('create', publication); }
    for (field in model.bookkeeping) {
      if (has(model.bookkeeping, field) && has(doc, field) && !same(doc[field], model.bookkeeping[field])) {
        refuse('create', field + " is the agents' bookkeeping: a new request has none (or " +
          JSON.stringify(model.bookkeeping[field]) + ')');
      }
    }
    var priority = ownership.priorityRefusal(doc);
    if (priority) { refuse('create', priority); }
    if (doc.last_update !== doc.created || entry.at !== doc.created) {
      refuse('time', "a new request is stamped once: created, last_update and its history entry's at are one time");
    }
    var late = stampRefusal('created', doc.created);
    if (late) { refuse('time', late); }
  }

  // An owner's change is stamped once, with the store's time, like a creation.
  function checkOwnerStamps(doc, appended) {
    for (var i = 0; i < appended.length; i++) {
      checkOwnerEntry(appended[i]);
      if (appended[i].at !== doc.last_update) {
        refuse('time', "an owner's change is stamped once: last_update and its history entries' at are one time");
      }
    }
    var late = stampRefusal('last_update', doc.last_update);
    if (late) { refuse('time', late); }
  }

  // A type names an agent document only as a string (an array ["heartbeat"] would name it as a
  // property key).
  function isOperatorDoc(doc) {
    return typeof doc.type === 'string' && has(model.operator_schemas, doc.type);
  }

  function checkControl() {
    schema.checkObject('doc', newDoc, model.operator_schemas[newDoc.type]);
    if (!(new RegExp(model.operator_id_patterns[newDoc.type])).test(newDoc._id) ||
        newDoc._id !== 'control:' + newDoc.kind + ':' + newDoc.name) {
      refuse('schema', 'doc._id must be control:' + newDoc.kind + ':' + newDoc.name);
    }
    if (model.control_modes[newDoc.kind].indexOf(newDoc.mode) === -1) {
      refuse('schema', 'a ' + newDoc.kind + ' may not be set to ' + newDoc.mode);
    }
    if (newDoc.kind === 'user' && newDoc.direction !== 'both') {
      refuse('schema', "a user's control has direction both");
    }
    if (userCtx.name && newDoc.by !== userCtx.name) {
      refuse('control', 'a setting is recorded by its operator, ' + userCtx.name + ', not ' + JSON.stringify(newDoc.by));
    }
    var history = newDoc.history, old = (oldDoc && oldDoc.history) || [];
    var last = history[history.length - 1], fields = ['mode', 'direction', 'reason', 'by', 'at'];
    for (var i = 0; i < fields.length; i++) {
      if (!last || last[fields[i]] !== newDoc[fields[i]]) { refuse('control', 'the last history entry is the setting itself'); }
    }
    if (history.length !== old.length + 1) { refuse('control', 'a change adds one history entry'); }
    for (i = 0; i < old.length; i++) {
      if (!same(history[i], old[i])) { refuse('control', 'history entries cannot be changed'); }
    }
  }

  function isHold(doc) {
    return doc.type === model.hold_type;
  }

  // A hold: its id names its destination and user; the last entry of its history is its state
  // (the agents keep the latest MAX_HOLD_HISTORY; its user only adds one, below).
  function checkHold() {
    if (!isHold(newDoc)) { refuse('hold', 'a hold stays a hold'); }
    schema.checkObject('doc', newDoc, model.hold_schema);
    var id = 'hold:' + newDoc.site + (newDoc.user ? ':' + newDoc.user : '');
    if (!(new RegExp(model.hold_id_pattern)).test(newDoc._id) || newDoc._id !== id) {
      refuse('schema', 'doc._id must be ' + id);
    }
    var history = newDoc.history, last = history[history.length - 1];
    var fields = ['state', 'reason', 'by', 'at'];
    for (var i = 0; i < fields.length; i++) {
      if (!last || last[fields[i]] !== newDoc[fields[i]]) { refuse('hold', 'the last history entry is the state itself'); }
    }
  }

  // What a hold's own user may do: release or cancel it while it holds, in their own name, with
  // the store's time; nothing else of it changes.
  function checkOwnerHoldChange() {
    if (!userCtx.name || newDoc.user !== userCtx.name) {
      refuse('hold', 'user ' + JSON.stringify(userCtx.name) + ' may not change a hold of user ' + JSON.stringify(newDoc.user));
    }
    if (!oldDoc) { refuse('hold', 'holds are started by the agents'); }
    if (oldDoc.state !== model.hold_active) { refuse('hold', 'only a hold in force may be released or cancelled'); }
    if (model.hold_owner_states.indexOf(newDoc.state) === -1) {
      refuse('hold', "a hold's user may release or cancel it, not set it " + newDoc.state);
    }
    for (var i = 0; i < model.hold_kept_by_owner.length; i++) {
      var field = model.hold_kept_by_owner[i];
      if (!same(newDoc[field], oldDoc[field])) { refuse('hold', field + ' is the agents\' to change'); }
    }
    if (newDoc.by !== userCtx.name) {
      refuse('hold', 'a change is recorded by its user, ' + userCtx.name + ', not ' + JSON.stringify(newDoc.by));
    }
    var history = newDoc.history, old = oldDoc.history;
    if (history.length !== old.length + 1) { refuse('hold', 'a change adds one history entry'); }
    for (i = 0; i < old.length; i++) {
      if (!same(history[i], old[i])) { refuse('hold', 'history entries cannot be changed'); }
    }
    var late = stampRefusal('at', newDoc.at);
    if (late) { refuse('time', late); }
  }

  function isAgentDoc(doc) {
    return typeof doc.type === 'string' && has(model.agent_schemas, doc.type);
  }

  function isFinal(doc) {
    // aso/model.py is_final: a file never copied, once its temporary copy is gone.
    if (model.never_copied.indexOf(doc.state) !== -1) { return model.final.cleanup.indexOf(doc.cleanup) !== -1; }
    for (var i = 0; i < model.axes.length; i++) {
      var axis = model.axes[i];
      if (model.final[axis].indexOf(doc[axis]) === -1) { return false; }
    }
    return true;
  }

  var isAdmin = hasRole(model.admin_roles);
  var isAgent = hasRole([model.agent_role]);

  // Every write of a user or an agent, deletions included. Admins are trusted (and a CouchDB
  // replication they run writes revisions that are not the current one, new_edits=false).
  if (!isAdmin) { checkCurrent(oldDoc); }
  // A deleted request may be created again: judge it as a creation.
  if (oldDoc && oldDoc._deleted) { oldDoc = null; }

  // CouchDB refuses a non-string id before it asks; the embedded store does not (a 500 here).
  if (newDoc._id !== undefined && typeof newDoc._id !== 'string') {
    refuse('schema', 'doc._id must be a string');
  }

  // Design documents: only admins (CouchDB refuses others before we run; say it anyway).
  if (newDoc._id.indexOf('_design/') === 0) {
    if (!isAdmin) { refuse('design', 'only admins may change design documents'); }
    return;
  }

  // Deletion: admins, or agents purging a finished request or an agent document, or
  // withdrawing one branch of a conflict (docs/store-quirks.md CLUSTER_CONFLICTING_BRANCHES).
  if (newDoc._deleted === true) {
    if (isAdmin) { return; }
    if (isAgent && oldDoc && (isAgentDoc(oldDoc) || isFinal(oldDoc))) { return; }
    // A branch of a cluster's conflict, withdrawn so that another stays the document.
    if (isAgent && newDoc.withdrawn === model.withdrawn) { return; }
    if (isAgent) { refuse('delete', 'agents may only delete finished requests'); }
    refuse('delete', 'only agents (finished requests) and admins may delete documents');
  }

  // Documents of the agents themselves (heartbeats): agents and admins write them.
  if (isAgentDoc(newDoc)) {
    if (!isAgent && !isAdmin) { refuse('agent-doc', 'only agents write ' + newDoc.type + ' documents'); }
    schema.checkObject('doc', newDoc, model.agent_schemas[newDoc.type]);
    if (!(new RegExp(model.agent_id_patterns[newDoc.type])).test(newDoc._id)) {
      refuse('schema', 'doc._id does not name a ' + newDoc.type);
    }
    return;
  }
  // Operators' controls (a site banned or draining, a user banned): only operators write them,
  // each setting recorded under its operator's name, and no earlier one rewritten.
  if (isOperatorDoc(newDoc) || (oldDoc && isOperatorDoc(oldDoc))) {
    var operatorType = isOperatorDoc(newDoc) ? newDoc.type : oldDoc.type;
    if (!isAdmin) { refuse('operator-doc', 'only operators write ' + operatorType + ' documents'); }
    checkControl();
    return;
  }
  // Holds: the agents start, check and end them, operators too; their user releases or cancels.
  if (isHold(newDoc) || (oldDoc && isHold(oldDoc))) {
    checkHold();
    if (!isAdmin && !isAgent) { checkOwnerHoldChange(); }
    return;
  }
  schema.checkRequest(newDoc, !oldDoc);

  var role = isAdmin ? 'admin' : (isAgent ? 'agent' : (userCtx.name && userCtx.name === newDoc.user ? 'owner' : null));
  if (role === null) {
    refuse('owner', 'user ' + JSON.stringify(userCtx.name) + ' may not write requests of user ' + JSON.stringify(newDoc.user));
  }
  if (role === 'admin') { return; }
  if (oldDoc && role === 'owner' && oldDoc.user !== userCtx.name) {
    refuse('owner', 'user ' + JSON.stringify(userCtx.name) + ' may not take over a request of user ' + JSON.stringify(oldDoc.user));
  }

  var axis, k, entry;

  // Creation: by the owner only, in a creation state, with its one history entry.
  if (!oldDoc) {
    if (role !== 'owner') { refuse('create', 'only the owner (or an admin) may create a request'); }
    if (!has(model.creation, newDoc.state)) {
      refuse('create', 'a request is created with state ' + Object.keys(model.creation).sort().join(' or ') + ', not ' + newDoc.state);
    }
    var born = model.creation[newDoc.state];
    for (axis in born) {
      if (has(born, axis) && born[axis].indexOf(newDoc[axis]) === -1) {
        refuse('create', 'a request created ' + newDoc.state + ' has ' + axis + ' ' + born[axis].join(' or ') + ', not ' + newDoc[axis]);
      }
    }
    // The sites of the catalogue.
    var ends = ['source', 'destination'];
    for (k = 0; k < ends.length; k++) {
      if (sites.indexOf(newDoc[ends[k]]) === -1) {
        refuse('site', ends[k] + ' ' + JSON.stringify(newDoc[ends[k]]) + ' is not a site of this ASO (its sites: ' + (sites.join(', ') || 'none') + ')');
      }
    }
    checkNamespaces(role);
    var task = ownership.taskRefusal(newDoc.task, userCtx.name);
    if (task) { refuse('task', task); }
    if (newDoc.history.length !== 1) { refuse('history', 'a new request has exactly one history entry'); }
    entry = newDoc.history[0];
    if (entry.axis !== 'state' || entry.from !== null || entry.to !== newDoc.state) {
      refuse('history', 'the first history entry must record the creation state');
    }
    if (entry.by !== userCtx.name) { refuse('history', 'history entries of an owner must be by ' + userCtx.name); }
    checkOwnerEntry(entry);
    checkOwnerCreation(newDoc, entry);
    return;
  }

  // A job retry's new file under the same LFN: the owner renews a request that was never
  // copied (failed or killed) as it resubmits it, with a higher job_retry (aso/model.py
  // RENEWABLE).
  var renewal = role === 'owner' && model.never_copied.indexOf(oldDoc.state) !== -1 &&
    newDoc.state === 'new' && typeof newDoc.job_retry === 'number' &&
    typeof oldDoc.job_retry === 'number' && newDoc.job_retry > oldDoc.job_retry;

  // Fields fixed at creation.
  for (k = 0; k < model.immutable.length; k++) {
    var field = model.immutable[k];
    if (renewal && model.renewable.indexOf(field) !== -1) { continue; }
    if (!same(newDoc[field], oldDoc[field])) { refuse('immutable', field + ' cannot change after creation'); }
  }
  checkNamespaces(role);

  // Owners change only the fields that record a kill, a resubmission or a publication reset
  // (and, renewing, what a job retry brings anew).
  if (role === 'owner') {
    for (k in newDoc) {
      if (renewal && model.renewable.indexOf(k) !== -1) { continue; }
      if (has(newDoc, k) && k.charAt(0) !== '_' && model.owner_mutable.indexOf(k) === -1 && !same(newDoc[k], oldDoc[k])) {
        refuse('owner', 'owners may only request a kill or a resubmission; ' + k + ' cannot change');
      }
    }
    for (k in oldDoc) {
      if (has(oldDoc, k) && k.charAt(0) !== '_' && !has(newDoc, k) && model.owner_mutable.indexOf(k) === -1) {
        refuse('owner', 'owners may only request a kill or a resubmission; ' + k + ' cannot be removed');
      }
    }
  }

  // History is append-only.
  var oldHistory = oldDoc.history || [];
  if (newDoc.history.length < oldHistory.length) { refuse('history', 'history entries cannot be removed'); }
  for (k = 0; k < oldHistory.length; k++) {
    if (!same(newDoc.history[k], oldHistory[k])) { refuse('history', 'history entries cannot be changed'); }
  }
  var appended = newDoc.history.slice(oldHistory.length);

  // Each axis that changed must be a legal transition for this role, recorded in history.
  var changed = 0;
  for (k = 0; k < model.axes.length; k++) {
    axis = model.axes[k];
    var from = oldDoc[axis], to = newDoc[axis];
    if (from === to) { continue; }
    var allowed = model.transitions[axis][from + '>' + to];
    var back = model.renewal_moves[axis];  // what a renewal also moves back (RENEWAL_MOVES)
    var renewing = renewal && back && back[0] === from && back[1] === to;
    if (renewing) { allowed = ['owner']; }
    if (!allowed) {
      refuse('transition', axis + ' cannot go from ' + from + ' to ' + to);
    }
    if (allowed.indexOf(role) === -1) {
      refuse('transition', 'only ' + allowed.join(' or ') + ' may move ' + axis + ' from ' + from + ' to ' + to + ', not the ' + role);
    }
    var needs = model.axis_requires_state[axis];
    if (needs && needs.indexOf(newDoc.state) === -1 && !renewing) {
      refuse('transition', axis + ' may only change while state is ' + needs.join(' or '));
    }
    entry = null;
    for (var h = 0; h < appended.length; h++) {
      if (appended[h].axis === axis && appended[h].from === from && appended[h].to === to) { entry = appended[h]; }
    }
    if (!entry) { refuse('history', 'the change of ' + axis + ' from ' + from + ' to ' + to + ' needs its history entry'); }
    if (role === 'owner' && entry.by !== userCtx.name) { refuse('history', 'history entries of an owner must be by ' + userCtx.name); }
    changed++;
  }
  if (appended.length !== changed) {
    refuse('history', 'history gets exactly one entry per state change (' + changed + ' changes, ' + appended.length + ' entries)');
  }
  if (role === 'owner' && newDoc.state === 'new' && oldDoc.state !== 'new') {
    // A file never copied whose temporary copy the cleaner deletes or deleted (aso/model.py
    // RENEWAL_MOVES): not resubmitted; renewed by a job retry's new file once the deletion is over.
    if (typeof oldDoc.discarding === 'number') {
      refuse('transition', 'its temporary copy is being deleted (cleaner.failed_grace): try again in a minute');
    }
    if (!renewal && newDoc.cleanup === 'cleaned') {
      refuse('transition', 'its temporary copy was deleted after it failed (cleaner.failed_grace): only a job retry\'s new file can be resubmitted');
    }
    if (renewal && newDoc.cleanup === 'cleaned') {
      refuse('transition', 'a job retry\'s new file is a temporary copy to delete: its renewal sets cleanup back to pending');
    }
  }
  if (role === 'owner' && changed === 0) {
    refuse('owner', 'owners may only request a kill or a resubmission');
  }
  if (role === 'owner') {
    // A publication reset asks for a publication, which only an output to publish has.
    var publication = newDoc.publication !== oldDoc.publication ? publicationRefusal(newDoc) : null;
    if (publication) { refuse('transition', publication); }
    checkOwnerStamps(newDoc, appended);
  }
}
