// What one finished request counts for in the statistics: included in each live view's map
// function where its marker stands (aso/provision/designdocs.py), and run by ASO in QuickJS when
// it purges a request into the kept statistics (aso/provision/storejs.py contribution): one
// function for both.
function contribution(doc) {
  var ENDED = /* aso/monitoring/statistics.py ENDED_STATES */ null, COL = /* aso/monitoring/statistics.py COLUMNS */ null;
  var BUCKETS = /* aso/monitoring/statistics.py BUCKETS */ null, NAMES = /* aso/monitoring/statistics.py BUCKET_NAMES */ null;
  if (doc.type !== /* aso/model.py REQUEST_TYPE */ null || ENDED.indexOf(doc.state) === -1) {
    return null;
  }
  var v = [], errors = {}, tmin = null, tmax = null, i;
  for (i = 0; i < COL.length; i++) { v.push(0); }
  function col(name) { return COL.indexOf(name); }
  function error(cls, which) {
    cls = cls || /* aso/monitoring/statistics.py UNKNOWN_CLASS */ null;
    if (!errors.hasOwnProperty(cls)) { errors[cls] = [0, 0]; }
    errors[cls][which] += 1;
  }
  if (doc.state === 'done') { v[col('files_done')] += 1; v[col('bytes_done')] += doc.size; }
  else if (doc.state === 'failed') { v[col('files_failed')] += 1; error(doc.error_class, 0); }
  else { v[col('files_killed')] += 1; }
  var attempts = doc.attempts || [];
  for (i = 0; i < attempts.length; i++) {
    var a = attempts[i];
    v[col('attempts')] += 1;
    if (a.outcome === 'done') {
      v[col('attempts_done')] += 1;
      if (a.ended !== null && a.ended !== undefined) {
        var s = Math.max(0, a.ended - a.submitted), b = 0;
        while (b < BUCKETS.length && s >= BUCKETS[b]) { b++; }
        v[col('time_count')] += 1;
        v[col('time_sum')] += s;
        v[col('time_' + NAMES[b])] += 1;
        tmin = tmin === null ? s : Math.min(tmin, s);
        tmax = tmax === null ? s : Math.max(tmax, s);
      }
    } else if (a.outcome === 'failed') {
      v[col('attempts_failed')] += 1;
      error(a.error_class, 1);
    }
  }
  var ended = doc.last_update, h = doc.history || [];
  for (i = h.length - 1; i >= 0; i--) { if (h[i].axis === 'state') { ended = h[i].at; break; } }
  var iso = new Date(ended * 1000).toISOString();
  var names = {link: doc.source + '>' + doc.destination, user: doc.user,
               destination: doc.destination, hour: iso.slice(11, 13)};
  // A request created `done` (its job wrote the file at the destination) is no copy: it counts
  // in its owner's own figures only, not in the links', destinations' and hours' everyone reads.
  if (doc.state === 'done' && v[col('attempts_done')] === 0) { names = {user: doc.user}; }
  return {ended: ended, day: iso.slice(0, 10), values: v, errors: errors, time_min: tmin, time_max: tmax,
          names: names};
}

// The request's contribution under each of its names: a row per name (empty while its copy is
// not over), what each live view emits from.
function contributionRows(doc) {
  var got = contribution(doc), rows = [];
  if (got === null) { return rows; }
  for (var by in got.names) {
    if (got.names.hasOwnProperty(by)) {
      rows.push({by: by, day: got.day, name: got.names[by], values: got.values,
                 errors: got.errors, time_min: got.time_min, time_max: got.time_max});
    }
  }
  return rows;
}
