function (doc) {
  // The live statistics (aso/monitoring/statistics.py): every finished request still in the files
  // database, under each of its names (link, user, destination, hour).
  // aso include: shared/statistics/contribution.js
  var rows = contributionRows(doc);
  for (var i = 0; i < rows.length; i++) {
    var r = rows[i];
    for (var cls in r.errors) {
      if (r.errors.hasOwnProperty(cls)) { emit([r.by, r.day, cls, r.name], r.errors[cls]); }
    }
  }
}
