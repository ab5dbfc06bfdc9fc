function (doc) {
  // The agents' shared work queue: one compact row per request that some agent must act upon,
  // nothing for finished ones, so the index stays as small as the backlog. Key [kind, ...]:
  // an agent reads its kind's key range (include_docs=true for the revision it writes back).
  // Kept alone in its own design document so that CouchDB builds it apart from the monitoring
  // views (the embedded store builds every view in its own pass anyway).
  // Which requests are work of which kind is aso/model.py's WORK table, which `aso db init`
  // writes in below (aso/provision/designdocs.py); the rest of each kind's key is aso/workqueue.py's
  // work_key, line by line.
  var work = /* aso/model.py WORK */ null;
  if (doc.type !== 'transfer_request') { return; }

  function stateSince() {  // when the file reached its state (aso/model.py state_since)
    var history = doc.history || [];
    for (var i = history.length - 1; i >= 0; i--) {
      if (history[i] && history[i].axis === 'state' && typeof history[i].at === 'number') { return history[i].at; }
    }
    return doc.last_update;
  }

  function keyOf(kind) {
    if (kind === 'submit') { return [doc.user, doc.source, doc.destination]; }
    if (kind === 'active') { return [doc.transfer ? doc.transfer.job_id : '']; }
    if (kind === 'decide') { return [doc.last_update]; }
    if (kind === 'clean') { return [doc.source]; }
    if (kind === 'discard') {  // a first try past the grace, or a retry once its backoff is over
      return doc.cleanup === 'cleanup_error' ? ['retry', doc.cleanup_retry_after || 0] : ['first', stateSince()];
    }
    return [doc.user, doc.publish_info ? doc.publish_info.dataset : ''];  // publish
  }

  var kind, axes, axis, holds;
  for (kind in work) {
    if (!Object.prototype.hasOwnProperty.call(work, kind)) { continue; }
    axes = work[kind];
    holds = true;
    for (axis in axes) {
      if (Object.prototype.hasOwnProperty.call(axes, axis) && axes[axis].indexOf(doc[axis]) === -1) {
        holds = false;
      }
    }
    if (holds) { emit([kind].concat(keyOf(kind)), null); }
  }
}
