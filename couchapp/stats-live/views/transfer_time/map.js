function (doc) {
  // The live statistics (aso/monitoring/statistics.py): every finished request still in the files
  // database, under each of its names (link, user, destination, hour).
  // aso include: shared/statistics/contribution.js
  var rows = contributionRows(doc);
  for (var i = 0; i < rows.length; i++) {
    var r = rows[i];
    if (r.time_min !== null) {
      emit([r.by, r.day, r.name], r.time_min);
      emit([r.by, r.day, r.name], r.time_max);
    }
  }
}
