function (doc) {
  // Failed transfer attempts per link and error class: [source, destination, class] → _count.
  if (doc.type === 'transfer_request') {
    (doc.attempts || []).forEach(function (a) {
      if (a.outcome === 'failed') {
        emit([doc.source, doc.destination, a.error_class || 'unknown'], null);
      }
    });
  }
}
