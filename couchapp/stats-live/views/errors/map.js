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
      for (var cls in r.errors) {
        if (r.errors.hasOwnProperty(cls)) { emit([r.by, r.day, cls, r.name], r.errors[cls]); }
      }
    }
  }
}
