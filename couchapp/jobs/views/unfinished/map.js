function (doc) {
  // Jobs a worker may have to run: key [service, state, created, id] (unique: pages are cut by
  // key, EMBEDDED_NO_STARTKEY_DOCID); the value is what a worker decides on before it reads the
  // job (aso/transfer/jobstore.py QueuedJob): [user, source site, destination site, lease until,
  // lease owner].
  if (doc.type === 'transfer_job' && doc.state !== 'finished') {
    var lease = doc.lease || {};
    emit([doc.service, doc.state, doc.created, doc._id],
      [doc.user || '', doc.source_site || '', doc.destination_site || '', lease.until || 0,
        lease.owner || null]);
  }
}
