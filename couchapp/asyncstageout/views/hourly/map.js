function (doc) {
  // What ended, hour by hour (UTC, from the history's epoch timestamps): copies done, failed
  // attempts, files failed for good or killed ([ 'state', hour, to ]) and publication outcomes
  // (['publication', hour, to]), each weighted by the file's size: _stats gives files (count)
  // and bytes (sum) at once.
  var ENDS = {state: ['done', 'failed_attempt', 'failed', 'killed'],
              publication: ['published', 'publication_error', 'publication_failed']};
  if (doc.type === 'transfer_request') {
    (doc.history || []).forEach(function (h) {
      if (ENDS[h.axis] && ENDS[h.axis].indexOf(h.to) !== -1) {
        emit([h.axis, new Date(h.at * 1000).toISOString().slice(0, 13), h.to], doc.size || 0);
      }
    });
  }
}
