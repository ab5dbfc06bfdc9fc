function (doc) {
  // The live statistics (aso/monitoring/statistics.py): every finished request still in the files
  // database, under each of its names (link, user, destination, hour).
  // aso include: shared/statistics/contribution.js
  var got = contribution(doc);
  if (got === null) { return; }
  for (var by in got.names) {
    if (got.names.hasOwnProperty(by)) {
      var r = {by: by, day: got.day, name: got.names[by], values: got.values,
               errors: got.errors, time_min: got.time_min, time_max: got.time_max};
      if (r.time_min !== null) {
        emit([r.by, r.day, r.name], r.time_min);
        emit([r.by, r.day, r.name], r.time_max);
      }
    }
  }
}
