function (newDoc, oldDoc, userCtx, secObj) {
  var roles = userCtx.roles || [];
  function has(role) { return roles.indexOf(role) !== -1; }
  function refuse(rule, why) { throw({forbidden: '[' + rule + '] ' + why}); }
  if (has('_admin') || has('aso-admin')) { return; }
  // EMBEDDED_VALIDATES_BEFORE_CONFLICT: a write based on another revision than
  // the current one is a conflict, refused here as one (the embedded store asks before it looks).
  var live = oldDoc && !oldDoc._deleted, rev = newDoc._rev;
  if (!(oldDoc ? rev === oldDoc._rev || (!live && rev === undefined) : rev === undefined)) {
    refuse('conflict', 'the write is based on another revision than the current one');
  }
  if (!has('aso-agent')) { refuse('stats', 'only agents and admins write statistics'); }
  if (newDoc._deleted) { refuse('stats', 'agents never delete statistics'); }
  if (newDoc._id === 'lease:purge') {
    if (newDoc.type !== 'analytics_lease' || typeof newDoc.holder !== 'string' ||
        typeof newDoc.until !== 'number') {
      refuse('schema', 'the purge lease has type analytics_lease, holder and until');
    }
    return;
  }
  if (newDoc._id.indexOf('monitor:') === 0) {
    // The monitoring summaries (aso/monitoring/summaries.py): recomputed, rewritten as they come.
    var TYPES = /* aso/monitoring/summaries.py TYPES */ null;
    if (TYPES.indexOf(newDoc.type) < 0) {
      refuse('schema', 'monitor: documents have one of the types ' + TYPES.join(', '));
    }
    return;
  }
  if (newDoc.type !== 'analytics_batch' || newDoc._id.indexOf('batch:') !== 0) {
    refuse('schema', 'statistics documents are analytics_batch documents with ids batch:...');
  }
  if (newDoc.status !== 'pending' && newDoc.status !== 'complete') {
    refuse('schema', 'a batch is pending or complete');
  }
  if (!Array.isArray(newDoc.rows) || typeof newDoc.requests !== 'object') {
    refuse('schema', 'a batch document needs rows and requests');
  }
  if (oldDoc && oldDoc.status === 'complete') {
    refuse('immutable', 'a complete batch never changes: its requests are counted');
  }
  if (!oldDoc && newDoc.status !== 'pending') {
    refuse('schema', 'a batch is written pending first, before its requests are deleted');
  }
}
