function (doc) {
  // Requests of a task, job by job: key [task, job_id, file_type]; the value is what a status
  // query shows of each file (`aso status`, the CRAB-style status API): one request per task.
  if (doc.type === 'transfer_request') {
    emit([doc.task, doc.job_id, doc.file_type], {
      state: doc.state, cleanup: doc.cleanup, publication: doc.publication, user: doc.user,
      source: doc.source, destination: doc.destination, last_update: doc.last_update,
      reason: doc.failure_reason || doc.publication_error || null
    });
  }
}
