function (doc) {
  // Batches written pending: purges a crash may have left half done (aso/monitoring/purge.py).
  var BATCH = /* aso/monitoring/statistics.py BATCH */ null;
  var PENDING = /* aso/monitoring/statistics.py PENDING */ null;
  if (doc.type === BATCH && doc.status === PENDING) { emit(doc.written, null); }
}
