function (doc) {
  // Jobs a worker may have to run: [service, state, created].
  if (doc.type === 'transfer_job' && doc.state !== 'finished') {
    emit([doc.service, doc.state, doc.created], null);
  }
}
