function (doc) {
  // The purged statistics (aso/monitoring/purge.py): the rows of complete batches.
  var BATCH = /* aso/monitoring/statistics.py BATCH */ null;
  var COMPLETE = /* aso/monitoring/statistics.py COMPLETE */ null;
  if (doc.type !== BATCH || doc.status !== COMPLETE) { return; }
  for (var i = 0; i < doc.rows.length; i++) {
    var r = doc.rows[i];
    for (var cls in r.errors) {
      if (r.errors.hasOwnProperty(cls)) { emit([r.by, r.day, cls, r.name], r.errors[cls]); }
    }
  }
}
