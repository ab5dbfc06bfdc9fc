function (doc) {
  // Publications that failed (to be tried again, or given up): [state, task, job_id] → reason.
  var failures = /* aso/model.py PUBLICATION_FAILURES */ null;
  if (doc.type === 'transfer_request' && failures.indexOf(doc.publication) !== -1) {
    emit([doc.publication, doc.task, doc.job_id], {error: doc.publication_error || null,
      block: doc.publication_block || null, attempts: doc.publication_attempts || 0});
  }
}
