function (doc) {
  // A task's files, one row each: key [task, job, file_type, id], unique and in job order (a
  // job id of digits is a number, so jobs sort 1, 2, 10; other ids sort after them, as text;
  // aso/model.py job_order). Page with start_key = the last row's key and skip=1. The value is
  // the status row of docs/status-api.md: what a client shows of a file. The failure is the
  // current one only (FAILING states); a copied or resubmitted file shows none.
  // `waiting`: why a file on its way waits (aso/model.py WAITING_WHY), since when (its last
  // change of state), until when (a cool-off), in which job (at the service); null once final.
  if (doc.type !== 'transfer_request') { return; }
  var failing = /* aso/model.py FAILING */ null;
  var publicationFailures = /* aso/model.py PUBLICATION_FAILURES */ null;
  var waitingWhy = /* aso/model.py WAITING_WHY */ null;
  var atTheService = /* aso/model.py AT_THE_SERVICE */ null;
  var job = /^[0-9]{1,15}$/.test(doc.job_id) ? Number(doc.job_id) : doc.job_id;
  var failed = failing.indexOf(doc.state) !== -1;
  var waiting = null;
  if (Object.prototype.hasOwnProperty.call(waitingWhy, doc.state)) {
    var history = doc.history || [], since = doc.created;
    for (var i = history.length - 1; i >= 0; i--) {
      if (history[i].axis === 'state') { since = history[i].at; break; }
    }
    waiting = {why: waitingWhy[doc.state], since: since,
      until: doc.state === 'retry' ? (doc.retry_after || null) : null,
      job_id: atTheService.indexOf(doc.state) !== -1 ? ((doc.transfer || {}).job_id || null) : null};
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
    created: doc.created, last_update: doc.last_update, waiting: waiting
  });
}
