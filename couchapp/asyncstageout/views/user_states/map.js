function (doc) {
  // Files per user and state, for the users page: [user, state] → _count (group_level=2).
  if (doc.type === 'transfer_request') {
    emit([doc.user, doc.state], null);
  }
}
