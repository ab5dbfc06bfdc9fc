function (doc) {
  // Requests of a task, job by job: key [task, job_id, file_type], value the three states.
  if (doc.type === 'transfer_request') {
    emit([doc.task, doc.job_id, doc.file_type], {state: doc.state, cleanup: doc.cleanup, publication: doc.publication, user: doc.user});
  }
}
