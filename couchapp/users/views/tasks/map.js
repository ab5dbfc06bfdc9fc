function (doc) {
  // A user's tasks and their files per state, for the user's page of the monitoring pages:
  // [user, task, state] → _count, read grouped (group_level=3) by the user's key range, newest
  // task first (descending), a page at a time. A design document of its own: adding it left the
  // other views' indexes as they were (CouchDB rebuilds all views of a changed design document).
  if (doc.type === 'transfer_request') {
    emit([doc.user, doc.task, doc.state], null);
  }
}
