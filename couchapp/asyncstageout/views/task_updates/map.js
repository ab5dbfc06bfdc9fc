function (doc) {
  // A task's files by their last change, for clients that poll: start_key [task, since].
  if (doc.type === 'transfer_request') {
    emit([doc.task, doc.last_update], {
      job_id: doc.job_id, file_type: doc.file_type, state: doc.state, cleanup: doc.cleanup,
      publication: doc.publication, reason: doc.failure_reason || doc.publication_error || null
    });
  }
}
