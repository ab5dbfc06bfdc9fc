function (doc) {
  // Files of a task per state of each axis: [task, axis, state] → _count (group_level=3).
  if (doc.type === 'transfer_request') {
    emit([doc.task, 'state', doc.state], null);
    emit([doc.task, 'cleanup', doc.cleanup], null);
    emit([doc.task, 'publication', doc.publication], null);
  }
}
