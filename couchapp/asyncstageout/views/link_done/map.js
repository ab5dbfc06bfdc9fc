function (doc) {
  // Copies done per link in time: [source, destination, end of the copy] → _count. A task's
  // estimated completion comes from its links' pace over their latest copies
  // (docs/status-api.md). A request created `done` (its job wrote the file at the
  // destination) is no copy on its link.
  if (doc.type === 'transfer_request' && doc.state === 'done') {
    var end = null;
    for (var i = 0; i < (doc.history || []).length; i++) {
      var h = doc.history[i];
      if (h.axis === 'state' && h.to === 'done' && h.from !== null) { end = h.at; }
    }
    if (end !== null) { emit([doc.source, doc.destination, end], null); }
  }
}
