function (doc) {
  // Files per link, for the links pages: [source, destination, 'state', state] and
  // [source, destination, 'task', task] → _count (group_level=4).
  if (doc.type === 'transfer_request') {
    emit([doc.source, doc.destination, 'state', doc.state], null);
    emit([doc.source, doc.destination, 'task', doc.task], null);
  }
}
