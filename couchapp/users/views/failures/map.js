function (doc) {
  // A user's failing files, for the user's page: [user, last change, id] → the file's current
  // failure (class and reason) and where it stands, read by the user's key range newest first
  // (descending, with a limit). Only files whose state is a current failure (aso/model.py
  // FAILING): once a file is copied again, or resubmitted, its failure is history. `at` is the
  // key's time again, exact: the page starts its next page there (the embedded store's row
  // keys may be a unit in the last place off, docs/store-quirks.md EMBEDDED_VIEW_KEYS_INEXACT).
  if (doc.type !== 'transfer_request') { return; }
  var failing = /* aso/model.py FAILING */ null;
  if (failing.indexOf(doc.state) === -1) { return; }
  emit([doc.user, doc.last_update, doc._id], {
    at: doc.last_update, task: doc.task, job_id: doc.job_id, state: doc.state, source: doc.source,
    destination: doc.destination, destination_lfn: doc.destination_lfn, size: doc.size,
    attempts: (doc.attempts || []).length, error_class: doc.error_class || null,
    reason: doc.failure_reason || null
  });
}
