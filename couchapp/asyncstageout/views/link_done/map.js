function (doc) {
  // Copies done per link in time: [source, destination, end of the copy] → _count. A task's
  // estimated completion comes from its links' throughput over the last hour.
  if (doc.type === 'transfer_request' && doc.state === 'done') {
    var end = doc.last_update;
    for (var i = 0; i < (doc.history || []).length; i++) {
      var h = doc.history[i];
      if (h.axis === 'state' && h.to === 'done') { end = h.at; }
    }
    emit([doc.source, doc.destination, end], null);
  }
}
