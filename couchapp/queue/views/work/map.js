function (doc) {
  // The agents' shared work queue: one compact row per request that some agent must act upon,
  // nothing for finished ones, so the index stays as small as the backlog. Key [kind, ...]:
  // an agent reads its kind's key range (include_docs=true for the revision it writes back).
  // Kept alone in its own design document so that CouchDB builds it apart from the monitoring
  // views (the embedded store builds every view in its own pass anyway).
  if (doc.type !== 'transfer_request') { return; }
  var s = doc.state;
  if (s === 'new') {
    emit(['submit', doc.user, doc.source, doc.destination], null);
  } else if (s === 'acquired') {
    emit(['lease', doc.lease ? doc.lease.until : 0], null);
  } else if (s === 'submitted' || s === 'kill_requested') {
    emit(['active', doc.transfer ? doc.transfer.job_id : ''], null);
  } else if (s === 'failed_attempt') {
    emit(['decide', doc.last_update], null);
  } else if (s === 'retry') {
    emit(['cooloff', doc.retry_after || 0], null);
  } else if (s === 'done') {
    if (doc.cleanup === 'pending' || doc.cleanup === 'cleanup_error') {
      emit(['clean', doc.source], null);
    }
    if (doc.publication === 'pending' || doc.publication === 'publishing' || doc.publication === 'publication_error') {
      emit(['publish', doc.user, doc.publish_info ? doc.publish_info.dataset : ''], null);
    }
  }
}
