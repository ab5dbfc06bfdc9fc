function (doc) {
  // The purged statistics (aso/monitoring/purge.py): the rows of complete batches.
  var BATCH = /* aso/monitoring/statistics.py BATCH */ null;
  var COMPLETE = /* aso/monitoring/statistics.py COMPLETE */ null;
  if (doc.type !== BATCH || doc.status !== COMPLETE) { return; }
  for (var i = 0; i < doc.rows.length; i++) {
    var r = doc.rows[i];
    if (r.time_min !== null) {
      emit([r.by, r.day, r.name], r.time_min);
      emit([r.by, r.day, r.name], r.time_max);
    }
  }
}
