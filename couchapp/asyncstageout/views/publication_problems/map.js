function (doc) {
  // Publications that failed (to be tried again, or given up): [state, task, job_id] → reason.
  if (doc.type === 'transfer_request' &&
      (doc.publication === 'publication_error' || doc.publication === 'publication_failed')) {
    emit([doc.publication, doc.task, doc.job_id], {error: doc.publication_error || null,
      block: doc.publication_block || null, attempts: doc.publication_attempts || 0});
  }
}
