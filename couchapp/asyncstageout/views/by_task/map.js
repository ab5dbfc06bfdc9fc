function (doc) {
  // A task's files, one row each: key [task, job, file_type, id], unique and in job order (a
  // job id of digits is a number, so jobs sort 1, 2, 10; other ids sort after them, as text;
  // aso/model.py job_order). Page with start_key = the last row's key and skip=1. The value is
  // the status row of docs/status-api.md: what a client shows of a file. The failure is the
  // current one only (FAILING states); a copied or resubmitted file shows none.
  // `waiting`: why a file not finished waits (aso/model.py WAITING_WHY): by its state while the
  // copy is on its way, once done by its publication, then its cleanup, while they are due;
  // since when (its last change on that axis, or its copy), until when (a cool-off, a retry), in which job
  // (at the service), which hold (held); null once finished, or stopped (failed, killed: its
  // owner's to resubmit).
  // `final`: the file is finished for good (hasEnded), whatever its state.
  // aso include: shared/ended.js
  if (doc.type !== 'transfer_request') { return; }
  var failing = /* aso/model.py FAILING */ null;
  var publicationFailures = /* aso/model.py PUBLICATION_FAILURES */ null;
  var waitingWhy = /* aso/model.py WAITING_WHY */ null;
  var atTheService = /* aso/model.py AT_THE_SERVICE */ null;
  var held = /* aso/model.py HELD */ null;
  var job = /^[0-9]{1,15}$/.test(doc.job_id) ? Number(doc.job_id) : doc.job_id;
  var failed = failing.indexOf(doc.state) !== -1;
  function sinceOn(axis) {
    var history = doc.history || [];
    for (var i = history.length - 1; i >= 0; i--) {
      if (history[i].axis === axis) { return history[i].at; }
    }
    return doc.created;
  }
  // A copied file waits on its publication or cleanup since its copy, or their last change.
  function since(axis) {
    return axis === 'state' ? sinceOn(axis) : Math.max(sinceOn(axis), sinceOn('state'));
  }
  function has(table, key) { return Object.prototype.hasOwnProperty.call(table, key); }
  var waiting = null, until = {retry: 'retry_after', publication_error: 'publication_retry_after',
    cleanup_error: 'cleanup_retry_after'};
  var axes = doc.state === 'done' ? ['publication', 'cleanup'] : ['state'];
  for (var a = 0; a < axes.length && !waiting; a++) {
    var value = doc[axes[a]];
    if (!has(waitingWhy[axes[a]], value)) { continue; }
    waiting = {why: waitingWhy[axes[a]][value], since: since(axes[a]),
      until: has(until, value) ? (doc[until[value]] || null) : null,
      job_id: atTheService.indexOf(value) !== -1 ? ((doc.transfer || {}).job_id || null) : null};
  }
  // A file whose last attempt a hold held waits held until the hold ends: its user's at its
  // destination (no room or permission: hold:T2_CH_CERN:alice) or a site's (no answer:
  // hold:T2_CH_CERN), the one the attempt names.
  var attempts = doc.attempts || [], last = attempts[attempts.length - 1];
  if (waiting && doc.state === 'retry' && last && typeof last.held === 'string') {
    waiting.why = held;
    waiting.hold = last.held;
  }
  // `note`: a file done although its owner killed it says so (the reason of that change).
  var note = null, entries = doc.history || [];
  for (var h = entries.length - 1; h >= 0 && doc.state === 'done'; h--) {
    if (entries[h].axis !== 'state') { continue; }
    if (entries[h].from === 'kill_requested') { note = entries[h].reason || 'killed too late'; }
    break;
  }
  emit([doc.task, job, doc.file_type, doc._id], {
    rev: doc._rev, job_id: doc.job_id, job_retry: doc.job_retry || 0, user: doc.user,
    state: doc.state, cleanup: doc.cleanup, publication: doc.publication,
    source: doc.source, destination: doc.destination,
    source_lfn: doc.source_lfn, destination_lfn: doc.destination_lfn, size: doc.size,
    attempts: (doc.attempts || []).length,
    error_class: failed ? (doc.error_class || null) : null,
    reason: failed ? (doc.failure_reason || null) : null,
    cleanup_error: doc.cleanup === 'cleanup_error' ? (doc.cleanup_error || null) : null,
    publication_error: publicationFailures.indexOf(doc.publication) !== -1 ?
      (doc.publication_error || null) : null,
    created: doc.created, last_update: doc.last_update, waiting: waiting, final: hasEnded(doc),
    note: note
  });
}
