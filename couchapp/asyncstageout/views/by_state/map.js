function (doc) {
  // Requests per (state, cleanup, publication): `aso request list` and the state summary.
  // Read stale (monitoring can be a little behind); group_level=1 gives counts per state.
  if (doc.type === 'transfer_request') {
    emit([doc.state, doc.cleanup, doc.publication], null);
  }
}
