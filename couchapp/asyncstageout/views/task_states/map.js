function (doc) {
  // Files of a task per state of each axis: [task, axis, state] → _count (group_level=3); and
  // per whether they are finished for good, [task, "final", true|false] (hasEnded): a task is
  // finished when it has no [task, "final", false] row.
  // aso include: shared/ended.js
  if (doc.type === 'transfer_request') {
    emit([doc.task, 'state', doc.state], null);
    emit([doc.task, 'cleanup', doc.cleanup], null);
    emit([doc.task, 'publication', doc.publication], null);
    emit([doc.task, 'final', hasEnded(doc)], null);
  }
}
