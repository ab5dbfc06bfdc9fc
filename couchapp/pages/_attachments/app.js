// ASO monitoring: a single page served from the pages database (store.pages_db, readable
// without logging in, so that this page can ask for a login), reading the files and statistics
// databases with the reader's own session: a store account logged in here (a cookie from the
// store's _session), or a certificate through the front end. Plain JS, no build step.
//
// Figures over all requests come from the monitoring summaries the analytics agent keeps in the
// statistics database (aso/monitoring/summaries.py): a few small documents per page whatever the number of
// requests, and history that outlives the purge. Pages about one task, link or file read the
// files database (a key range of a view, or one document).
//
// Addresses (everything a page shows is in its address, so a view can be bookmarked and sent):
// #overview?window=24h|7d|30d|1y&unit=files|bytes&until=YYYY-MM-DD, #links?window=...,
// #link/SRC>DST?window=..., #errors?window=...&group=...&link=...&site=...&class=..., #users,
// #user/NAME?tasks_from=TASK&failures_from=[TIME,ID], #publication?window=..., #agents,
// #task/NAME?state=STATE, #file/ID, #login.
'use strict';

var PAGES_DB = location.pathname.split('/')[1];
var PAGES = '/' + PAGES_DB + '/_design/pages';
var FILES = null; // '/<files database>', from the settings
var DDOC = null;  // the files database's views
var USERS_VIEWS = null; // the files database's views of a user's tasks and failures
var STALE_AFTER = 120; // seconds without a heartbeat before an agent is shown as stale
var REFRESH = 30000;
var SETTINGS = null; // the design document's `aso` member: files_db, stats_db, transfer_job_url, states, waiting_words
var HOUR = 3600, DAY = 86400;
var BYTES_DONE = 'bytes_done'; // in a user's live summary, beside the states (aso/monitoring/summaries.py)
// The groups of states the pages show: aso/model.py PAGES_STATES, read with SETTINGS.
var STATES = {on_its_way: [], in_flight: [], failing: [], file_ends: [], attempt_failures: [],
  current_failures: [], publication_ends: [], publication_failures: []};

// A read the store refused for want of a login: the page asks for one.
function LoginNeeded(reason) { this.message = reason; }
// A page or document that is not there: said in words, not as an HTTP status.
function NotFound(message) { this.message = message; }

function settings() {
  if (SETTINGS) { return Promise.resolve(SETTINGS); }
  return get(PAGES).then(function (ddoc) {
    SETTINGS = ddoc.aso || {};
    STATES = SETTINGS.states || STATES;
    FILES = '/' + encodeURIComponent(SETTINGS.files_db);
    DDOC = FILES + '/_design/asyncstageout/_view/';
    USERS_VIEWS = FILES + '/_design/users/_view/';
    return SETTINGS;
  });
}

function summary(id) {
  // One monitoring summary document (null until the analytics agent has written it).
  return settings().then(function (s) {
    return fetch('/' + s.stats_db + '/' + encodeURIComponent(id), {credentials: 'same-origin'});
  }).then(function (r) {
    if (r.status === 404) { return null; }
    return checked(r, id);
  });
}

function summaries(prefix, first, last) {
  // The summary documents with ids prefix+first ... prefix+last, in time order.
  return settings().then(function (s) {
    return get('/' + s.stats_db + '/_all_docs', {start_key: prefix + first,
      end_key: prefix + last, include_docs: true});
  }).then(function (res) {
    return res.rows.filter(function (r) { return r.doc; }).map(function (r) { return r.doc; });
  });
}

function noSummaries() {
  return [el('p', {'class': 'error', id: 'no-summaries'}, ['No monitoring summaries yet: ' +
    'the analytics agent writes them (aso run starts it).'])];
}

function get(path, params) {
  var query = Object.keys(params || {}).map(function (k) {
    return encodeURIComponent(k) + '=' + encodeURIComponent(JSON.stringify(params[k]));
  }).join('&');
  return fetch(path + (query ? '?' + query : ''), {credentials: 'same-origin'})
    .then(function (r) { return checked(r, path); });
}

function checked(response, what) {
  // The answer's JSON; a refusal as the store words it (its `reason`), a 401 as LoginNeeded.
  return response.json().catch(function () { return {}; }).then(function (body) {
    var age = response.headers.get('age');
    if (response.ok && age !== null && body && typeof body === 'object') { body.age = Number(age); }
    if (response.ok) { return body; }
    var reason = body.reason || body.error || ('HTTP ' + response.status);
    if (response.status === 401) { throw new LoginNeeded(reason); }
    if (response.status === 404) { throw new NotFound(what + ': not found (' + reason + ')'); }
    throw new Error(what + ': ' + reason + ' (HTTP ' + response.status + ')');
  });
}

function el(tag, attrs, children) {
  var node = document.createElement(tag);
  Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
  (children || []).forEach(function (c) {
    node.appendChild(typeof c === 'string' || typeof c === 'number'
      ? document.createTextNode(String(c)) : c);
  });
  return node;
}

function countedAgo(id, answer) {
  // A count the front end kept (its answer's Age): counting it costs the store, and it is
  // counted again once the one kept is as old as ten times what it cost.
  if (typeof answer.age !== 'number') { return []; }
  return [el('p', {'class': 'note', id: id, 'data-age': answer.age}, ['Counted ' + answer.age +
    ' s ago: a count that costs the store is kept for a while (ten times what it cost), then counted again.'])];
}

function table(id, headers, rows) {
  return el('table', {id: id}, [
    el('thead', {}, [el('tr', {}, headers.map(function (h) { return el('th', {}, [h]); }))]),
    el('tbody', {}, rows)
  ]);
}

function when(epoch) {
  return epoch ? new Date(epoch * 1000).toISOString().replace('T', ' ').slice(0, 19) : '';
}

// The windows a page can show: the address's key → [label, seconds].
var WINDOWS = {'24h': ['24 hours', 24 * HOUR], '7d': ['7 days', 7 * DAY],
  '30d': ['30 days', 30 * DAY], '1y': ['1 year', 365 * DAY]};
var QUEUE_COLOURS = ['#9bd', '#e93', '#68c', '#36a', '#a6c', '#777'];
var COLOURS = {done: '#3a7', failed_attempt: '#e93', failed: '#c33', killed: '#888',
  published: '#37a', publication_error: '#e93', publication_failed: '#c33'};
// The overview's and publication page's choices, read from the address by route(): window,
// unit, and the window's end ('' = now).
var DEFAULT_VIEW = {window: '24h', unit: 'files', until: ''};
var view = DEFAULT_VIEW;
var PARAMS = {}; // the address's parameters (after `?`)

function iso(epoch) { return new Date(epoch * 1000).toISOString(); }

function windowSpan() {
  // {step, starts: bucket starts (epoch), oldest first}: hours up to 7 days, days beyond.
  var length = WINDOWS[view.window][1];
  var step = length > 7 * DAY ? DAY : HOUR;
  var end = view.until ? Date.parse(view.until + 'T00:00:00Z') / 1000 + DAY : Date.now() / 1000;
  var last = Math.floor((end - 1) / step) * step;
  var starts = [];
  for (var t = last - length + step; t <= last; t += step) { starts.push(t); }
  return {step: step, starts: starts};
}

function endsOf(moves, axis) {
  // {to: {files, bytes}} of the moves of one axis.
  var out = {};
  Object.keys((moves || {})[axis] || {}).forEach(function (name) {
    var to = name.split('>')[1], m = moves[axis][name];
    out[to] = out[to] || {files: 0, bytes: 0};
    out[to].files += m[0]; out[to].bytes += m[1];
  });
  return out;
}

function netBacklog(moves) {
  var n = 0;
  Object.keys((moves || {}).state || {}).forEach(function (name) {
    var parts = name.split('>'), files = moves.state[name][0];
    if (STATES.on_its_way.indexOf(parts[1]) >= 0) { n += files; }
    if (STATES.on_its_way.indexOf(parts[0]) >= 0) { n -= files; }
  });
  return n;
}

function queuesOf(totals) {
  // {state: files} of the backlog's states, from a summary's totals.
  var out = {};
  STATES.on_its_way.forEach(function (s) { out[s] = ((totals || {}).state || {})[s] || 0; });
  return out;
}

function netQueues(moves, start) {
  // The queues after a bucket's moves, from the queues before it.
  var out = {};
  Object.keys(start).forEach(function (s) { out[s] = start[s]; });
  Object.keys((moves || {}).state || {}).forEach(function (name) {
    var parts = name.split('>'), files = moves.state[name][0];
    if (parts[1] in out) { out[parts[1]] += files; }
    if (parts[0] in out) { out[parts[0]] -= files; }
  });
  return out;
}

function addMoves(into, moves) {
  Object.keys(moves || {}).forEach(function (axis) {
    into[axis] = into[axis] || {};
    Object.keys(moves[axis]).forEach(function (name) {
      var m = into[axis][name] = into[axis][name] || [0, 0];
      m[0] += moves[axis][name][0]; m[1] += moves[axis][name][1];
    });
  });
}

function emptyBucket(start) {
  // moves: axis → "from>to" → [files, bytes]; links: link → [copies done, bytes done, failed
  // attempts, transfer seconds of the copies done]; failures: link → class → message pattern →
  // [attempts, first, last, ids].
  return {start: start, moves: {}, links: {}, failures: {}, backlog: null};
}

function addDetail(bucket, doc) {
  // A summary document's per-link figures and failures into a bucket (aso/monitoring/summaries.py).
  Object.keys(doc.link_hours || {}).forEach(function (link) {
    var mine = bucket.links[link] = bucket.links[link] || [0, 0, 0, 0];
    doc.link_hours[link].forEach(function (n, i) { mine[i] += n; });
  });
  eachFailure(doc.failures, function (link, cls, pattern, entry) {
    var into = ((bucket.failures[link] = bucket.failures[link] || {})[cls] =
      (bucket.failures[link] || {})[cls] || {});
    var mine = into[pattern];
    if (!mine) { into[pattern] = [entry[0], entry[1], entry[2], entry[3].slice()]; return; }
    mine[0] += entry[0]; mine[1] = Math.min(mine[1], entry[1]); mine[2] = Math.max(mine[2], entry[2]);
    entry[3].forEach(function (id) { if (mine[3].length < 3 && mine[3].indexOf(id) < 0) { mine[3].push(id); } });
  });
}

function eachFailure(failures, visit) {
  Object.keys(failures || {}).forEach(function (link) {
    Object.keys(failures[link]).forEach(function (cls) {
      Object.keys(failures[link][cls]).forEach(function (pattern) {
        visit(link, cls, pattern, failures[link][cls][pattern]);
      });
    });
  });
}

function history(withDetail) {
  // The window's buckets: {span, live, buckets: [{start, moves, backlog}]} from the
  // closed hour (or day) documents, the live document's open hours, and the last closed bucket
  // before the window (where the backlog stood).
  var span = windowSpan(), step = span.step;
  var first = span.starts[0], last = span.starts[span.starts.length - 1];
  var name = step === DAY ? function (t) { return iso(t).slice(0, 10); }
    : function (t) { return iso(t).slice(0, 13); };
  var prefix = step === DAY ? 'monitor:day:' : 'monitor:hour:';
  return Promise.all([
    summary('monitor:live'),
    summaries(prefix, name(first), name(last) + '\ufff0'),
    settings().then(function (s) {
      return get('/' + s.stats_db + '/_all_docs', {start_key: prefix + name(first - 1),
        end_key: prefix, descending: true, limit: 1, include_docs: true});
    }),
    // A day not yet closed: its closed hours so far.
    step === DAY ? summaries('monitor:hour:', name(last), name(last) + '\ufff0') : Promise.resolve([]),
    // The links and failures (withDetail: the links and errors pages), kept apart from the
    // moves: the hours' or days' of the window, and the closed hours of a day not yet closed.
    withDetail ? summaries(step === DAY ? 'monitor:linkday:' : 'monitor:linkhour:', name(first),
      name(last) + '\ufff0') : Promise.resolve([]),
    withDetail && step === DAY ? summaries('monitor:linkhour:', name(last), name(last) + '\ufff0')
      : Promise.resolve([])
  ]).then(function (got) {
    var live = got[0];
    if (!live) { return null; }
    var by = {};
    var bucket = function (start) {
      return by[start] = by[start] || emptyBucket(start);
    };
    got[1].forEach(function (d) {
      var b = bucket(d.start);
      addMoves(b.moves, d.moves); b.backlog = d.backlog;
      b.queues = queuesOf(d.totals);
    });
    var closedDay = by[last] !== undefined;
    got[3].forEach(function (d) {
      if (!closedDay) { addMoves(bucket(last).moves, d.moves); }
    });
    got[4].forEach(function (d) { addDetail(bucket(d.start), d); });
    got[5].forEach(function (d) { if (!closedDay) { addDetail(bucket(last), d); } });
    (live.open || []).forEach(function (h) {
      var start = Math.floor(h.start / step) * step;
      if (start < first || start > last) { return; }
      addMoves(bucket(start).moves, h.moves);
      if (withDetail) { addDetail(bucket(start), h); }
    });
    // The backlog at each bucket's end: a closed bucket says it; otherwise the one before plus
    // what this bucket's moves added to it (open hours, the day so far, or nothing).
    // So are the queues (files per backlog state).
    var before = got[2].rows.length ? got[2].rows[0].doc : null;
    var carry = before ? before.backlog : 0, queues = queuesOf(before ? before.totals : {});
    var buckets = span.starts.map(function (start) {
      var b = by[start] || emptyBucket(start);
      if (start > live.as_of) {
        b.backlog = null; // not yet
        b.queues = null;
      } else {
        if (b.backlog === null) { b.backlog = carry + netBacklog(b.moves); }
        if (!b.queues) { b.queues = netQueues(b.moves, queues); }
        carry = b.backlog;
        queues = b.queues;
      }
      return b;
    });
    return {span: span, live: live, buckets: buckets, label: name};
  });
}


function niceTop(most) {
  // The top of a chart's scale: 1, 2 or 5 times a power of ten, at or above `most`.
  var top = Math.max(most, 1), power = Math.pow(10, Math.floor(Math.log10(top)));
  var steps = [1, 2, 5, 10];
  for (var i = 0; i < steps.length; i++) {
    if (steps[i] * power >= top) { return steps[i] * power; }
  }
  return 10 * power;
}

function bytes(n) {
  // 1234567 → "1.23 MB" (SI units, as transfer services show them).
  var units = ['B', 'kB', 'MB', 'GB', 'TB', 'PB'], i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  var whole = i === 0 && Math.round(n) === n;
  return (whole ? String(n) : n.toFixed(n < 10 ? 2 : 1)) + ' ' + units[i];
}

function amount(n, unit) { return unit === 'bytes' ? bytes(n) : String(n); }

function rate(bytesPerSecond) { return bytes(bytesPerSecond) + '/s'; } // "12.5 MB/s"

function svg(tag, attrs, text) {
  var node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
  if (text !== undefined) { node.textContent = text; }
  return node;
}

function svgChart(got, id, axis, ends, unit) {
  // What ended in each bucket, stacked per end, in the unit; on the overview's chart of files
  // (id hourly-chart) the backlog at each bucket's end as a line.
  var per = got.span.step === DAY ? 'day' : 'hour';
  return timeChart(got, {
    id: id,
    title: (unit === 'bytes' ? 'bytes' : id === 'attempts-chart' ? 'attempts' : 'files') + ' per ' + per,
    format: function (v) { return amount(v, unit); },
    stacks: ends.map(function (e) {
      return {key: e, colour: COLOURS[e] || '#999',
        value: function (b) { return (endsOf(b.moves, axis)[e] || {})[unit] || 0; }};
    }),
    line: id !== 'hourly-chart' ? null : {key: 'backlog', colour: '#33c',
      label: 'backlog at the end of each ' + per + ' (files, right axis)',
      value: function (b) { return b.backlog; }, format: String}
  });
}

function timeChart(got, spec) {
  // Bars over time, stacked (spec.stacks: {key, colour, value(bucket), label (default: key)}), on a left axis
  // (spec.format, spec.title); optionally a line (spec.line: {key, label, colour,
  // value(bucket) or null, top (a fixed scale), format}) on a right axis; time along the
  // bottom (UTC); a legend above. Plain SVG, no library.
  var buckets = got.buckets, n = buckets.length;
  var per = got.span.step === DAY ? 'day' : 'hour';
  var left = 70, right = spec.line ? 60 : 20, top = 44, plot = 180, bottom = 36;
  var barWidth = Math.max(3, Math.min(30, Math.floor(900 / n)));
  var width = left + n * barWidth + right;
  var chart = svg('svg', {width: width, height: top + plot + bottom, role: 'img', id: spec.id});
  var totals = buckets.map(function (b) {
    return spec.stacks.reduce(function (sum, st) { return sum + st.value(b); }, 0);
  });
  var scale = niceTop(Math.max.apply(null, totals.concat([0])));
  var y = function (v, most) { return top + plot - v / most * plot; };
  for (var t = 0; t <= 4; t++) { // the left axis: five ticks with grid lines
    var v = scale * t / 4;
    chart.appendChild(svg('line', {x1: left, x2: left + n * barWidth, y1: y(v, scale),
      y2: y(v, scale), stroke: '#ddd'}));
    chart.appendChild(svg('text', {x: left - 6, y: y(v, scale) + 4, 'text-anchor': 'end',
      'class': 'y-tick', 'data-value': v}, spec.format(v)));
  }
  chart.appendChild(svg('text', {x: 4, y: top - 10, 'class': 'axis-title'}, spec.title));
  buckets.forEach(function (b, i) {
    var base = top + plot;
    spec.stacks.forEach(function (st) {
      var v = st.value(b);
      if (!v) { return; }
      var height = v / scale * plot;
      base -= height;
      var bar = svg('rect', {x: left + i * barWidth + 1, width: Math.max(barWidth - 2, 1),
        y: base, height: height, fill: st.colour, 'data-end': st.key,
        'data-bucket': got.label(b.start), 'data-value': v});
      bar.appendChild(svg('title', {}, got.label(b.start) + ' UTC: ' + st.key + ' ' + spec.format(v)));
      chart.appendChild(bar);
    });
  });
  var every = Math.max(1, Math.ceil(n / 8)); // about eight time labels, whole buckets
  buckets.forEach(function (b, i) {
    if (i % every) { return; }
    var label = per === 'hour' ? iso(b.start).slice(5, 13).replace('T', ' ') + 'h'
      : iso(b.start).slice(0, 10);
    chart.appendChild(svg('text', {x: left + i * barWidth, y: top + plot + 16, 'class': 'x-tick'}, label));
  });
  chart.appendChild(svg('text', {x: left, y: top + plot + 32, 'class': 'axis-title'},
    'UTC, one bar per ' + per + ' of the window'));
  var x = left;
  spec.stacks.forEach(function (st) { // the legend
    chart.appendChild(svg('rect', {x: x, y: 4, width: 10, height: 10, fill: st.colour}));
    var label = st.label || st.key;
    chart.appendChild(svg('text', {x: x + 14, y: 13, 'class': 'legend', 'data-end': st.key}, label));
    x += 24 + 7 * label.length;
  });
  if (spec.line) {
    var line = spec.line;
    var values = buckets.map(function (b) { return line.value(b); });
    var most = line.top || niceTop(Math.max.apply(null, values.map(function (v) { return v || 0; }).concat([1])));
    var points = [];
    buckets.forEach(function (b, i) {
      if (values[i] === null || values[i] === undefined) { return; }
      points.push((left + i * barWidth + barWidth / 2).toFixed(1) + ',' + y(values[i], most).toFixed(1));
      chart.appendChild(svg('circle', {cx: left + i * barWidth + barWidth / 2, cy: y(values[i], most),
        r: 2, fill: line.colour, 'class': 'point', 'data-bucket': got.label(b.start), 'data-value': values[i]}));
    });
    chart.appendChild(svg('polyline', {points: points.join(' '), id: line.key + '-line', fill: 'none',
      stroke: line.colour, 'stroke-width': 2}));
    for (var r = 0; r <= 4; r++) {
      chart.appendChild(svg('text', {x: left + n * barWidth + 6, y: y(most * r / 4, most) + 4,
        'class': 'y2-tick', 'data-value': most * r / 4}, line.format(most * r / 4)));
    }
    chart.appendChild(svg('line', {x1: x, x2: x + 14, y1: 9, y2: 9, stroke: line.colour, 'stroke-width': 2}));
    chart.appendChild(svg('text', {x: x + 18, y: 13, 'class': 'legend', 'data-end': line.key}, line.label));
  }
  return chart;
}

function choices(units) {
  // The window, its end and (with `units`) the unit: each choice goes into the address.
  var pick = function (name, options) {
    var select = el('select', {id: name}, Object.keys(options).map(function (o) {
      var opt = el('option', {value: o}, [options[o]]);
      if (view[name] === o) { opt.setAttribute('selected', 'selected'); }
      return opt;
    }));
    select.addEventListener('change', function () { setParam(name, select.value); });
    return select;
  };
  var labels = {};
  Object.keys(WINDOWS).forEach(function (k) { labels[k] = WINDOWS[k][0]; });
  var until = el('input', {type: 'date', id: 'until', value: view.until});
  until.addEventListener('change', function () { setParam('until', until.value); });
  var parts = ['window ', pick('window', labels), ' ending ', until, ' (empty: now)'];
  if (units) { parts.push(' in ', pick('unit', {files: 'files', bytes: 'bytes'})); }
  return el('p', {'class': 'choices'}, parts);
}

function addCounts(into, row) {
  Object.keys(row).forEach(function (k) { into[k] = (into[k] || 0) + row[k]; });
}

function windowTasks(got) {
  // What each task did in a 24-hour window: {tasks: {task: {"axis:to" or "created": files}},
  // other: {user: {tasks: n, "axis:to": files}}} (the tasks a summary folded, beyond the
  // most recent it lists in full), from the live document when the window ends now, else
  // from the window's hourly task documents; null for longer windows (thousands of tasks may
  // be active in a day).
  if (view.window !== '24h') { return Promise.resolve(null); }
  if (!view.until) {
    return Promise.resolve({tasks: got.live.tasks || {}, other: got.live.tasks_other || {}});
  }
  var starts = got.span.starts;
  return summaries('monitor:tasks:', got.label(starts[0]),
    got.label(starts[starts.length - 1]) + '\ufff0').then(function (docs) {
    var tasks = {}, other = {};
    docs.forEach(function (d) {
      Object.keys(d.tasks).forEach(function (t) { tasks[t] = tasks[t] || {}; addCounts(tasks[t], d.tasks[t]); });
      Object.keys(d.tasks_other || {}).forEach(function (u) { other[u] = other[u] || {}; addCounts(other[u], d.tasks_other[u]); });
    });
    return {tasks: tasks, other: other};
  });
}

function foldedTotals(other) {
  // The folded tasks of every user (or of one) as one row: {tasks: n, "axis:to": files}.
  var all = {};
  Object.keys(other || {}).forEach(function (u) { addCounts(all, other[u]); });
  return all;
}

function activeTasks(active) {
  // Tasks with events in the window: files created, ended and published there; the tasks the
  // summaries folded (too many to list) as one row of their totals.
  if (active === null) { return [el('p', {id: 'tasks-note'}, ['Active tasks: choose a 24-hour window.'])]; }
  var tasks = active.tasks, folded = foldedTotals(active.other);
  var columns = ['created', 'state:done', 'state:failed_attempt', 'state:failed', 'state:killed',
    'publication:published'];
  var names = Object.keys(tasks).sort(function (a, b) {
    var n = function (t) { return columns.reduce(function (s, c) { return s + (tasks[t][c] || 0); }, 0); };
    return n(b) - n(a) || a.localeCompare(b);
  });
  var rows = names.slice(0, 100).map(function (t) {
    return el('tr', {'data-task': t}, [
      el('td', {}, [el('a', {href: '#task/' + encodeURIComponent(t)}, [t])])].concat(columns.map(function (c) {
      return el('td', {'class': 'n', 'data-column': c}, [tasks[t][c] || 0]);
    })));
  });
  var out = [el('h2', {}, ['Active tasks (' + WINDOWS[view.window][0] + (names.length > 100 ?
    ', the 100 busiest of ' + names.length + ' listed' : '') + ')'])];
  if (folded.tasks) {
    rows.push(el('tr', {'data-task': '', id: 'tasks-folded-row'}, [el('th', {}, ['other tasks (' + folded.tasks + ')'])]
      .concat(columns.map(function (c) { return el('td', {'class': 'n', 'data-column': c}, [folded[c] || 0]); }))));
    out.push(el('p', {'class': 'note', id: 'tasks-folded', 'data-tasks': folded.tasks}, [folded.tasks +
      ' more tasks were active than the summaries list one by one: their files are counted together ' +
      'in the last row, "other tasks" (a task folded in several hours counts once per hour).']));
  }
  return out.concat([table('tasks', ['task'].concat(columns.map(function (c) {
    return c.replace('state:', '').replace('publication:', ''); })), rows)]);
}

function overview() {
  return history().then(function (got) {
    if (!got) { return [got, null]; }
    return windowTasks(got).then(function (tasks) { return [got, tasks]; });
  }).then(function (both) {
    var got = both[0], tasks = both[1];
    if (!got) { return noSummaries(); }
    var live = got.live, total = 0;
    var states = (live.totals || {}).state || {};
    var rows = Object.keys(states).sort().map(function (s) {
      total += states[s];
      return el('tr', {'data-state': s}, [el('td', {}, [s]), el('td', {'class': 'n'}, [states[s]])]);
    });
    rows.push(el('tr', {'data-state': 'total'}, [el('th', {}, ['total']),
      el('td', {'class': 'n'}, [total])]));
    // Files and attempts apart: each file ends once (done, failed for good, killed); failed
    // attempts are counted on their own, in a chart of their own.
    var fileEnds = STATES.file_ends, attemptEnds = STATES.attempt_failures;
    var ends = fileEnds.concat(attemptEnds);
    var seconds = got.span.step;
    var perBucket = got.buckets.filter(function (b) {
      return Object.keys(endsOf(b.moves, 'state')).some(function (e) { return ends.indexOf(e) >= 0; });
    }).map(function (b) {
      var e = endsOf(b.moves, 'state');
      var cellsOf = ends.map(function (end) {
        var v = (e[end] || {})[view.unit] || 0;
        return el('td', {'class': 'n', 'data-end': end, 'data-value': v}, [amount(v, view.unit)]);
      });
      var throughput = ((e.done || {}).bytes || 0) / seconds;
      return el('tr', {'data-hour': got.label(b.start)}, [el('td', {}, [got.label(b.start)])].concat(cellsOf, [
        el('td', {'class': 'n', 'data-end': 'throughput', 'data-value': throughput}, [rate(throughput)]),
        el('td', {'class': 'n', 'data-backlog': ''}, [b.backlog === null ? '' : b.backlog])]));
    });
    var unitName = got.span.step === DAY ? 'day' : 'hour';
    return [el('h2', {}, ['Files per state']),
      el('p', {id: 'as-of'}, ['as of ' + when(live.as_of) + ' UTC (monitoring summaries; ' +
        'backlog ', el('span', {id: 'backlog-now'}, [live.backlog]), ')']),
      table('states', ['state', 'files'], rows),
      el('h2', {}, ['Files ended per ' + unitName + ' (' + view.unit + ')']), choices(true),
      el('p', {'class': 'note'}, ['Each file counts once, when it ends: done, failed (given up) or ' +
        'killed. Failed attempts are counted apart, below: a file given up after two failed attempts ' +
        'is 2 failed attempts and 1 failed file.']),
      svgChart(got, 'hourly-chart', 'state', fileEnds, view.unit),
      el('h2', {}, ['Failed attempts per ' + unitName + ' (' + view.unit + ')']),
      svgChart(got, 'attempts-chart', 'state', attemptEnds, view.unit),
      table('hourly', [unitName + ' (UTC)'].concat(fileEnds.map(function (e) { return e + ' (files ended)'; }),
        attemptEnds.map(function (e) { return e + ' (attempts)'; }), ['throughput of done copies (' +
        unitName + ' average)', 'backlog at end (files)']), perBucket),
      el('h2', {}, ['Queues at the end of each ' + unitName + ' (files per state on their way)']),
      timeChart(got, {id: 'queues-chart', title: 'files waiting or in flight', format: String,
        stacks: STATES.on_its_way.map(function (q, i) {
          return {key: q, colour: QUEUE_COLOURS[i % QUEUE_COLOURS.length],
            value: function (b) { return (b.queues || {})[q] || 0; }};
        })})].concat(activeTasks(tasks));
  });
}

function controls() {
  // The operators' controls in force (aso site|user ban, drain), each with who set it, when
  // and why; `allow` lifted the others. At most 1,000 (one per site or user ever set).
  return get(FILES + '/_all_docs', {startkey: 'control:', endkey: 'control:\ufff0',
    include_docs: true, limit: 1000}).then(function (res) {
    var docs = res.rows.map(function (r) { return r.doc; }).filter(function (d) {
      return d && d.mode !== 'allow';
    });
    var heading = el('h2', {}, ["Operators' controls (aso site, aso user)"]);
    if (!docs.length) { return [heading, el('p', {id: 'controls'}, ['none: every site and user may start copies'])]; }
    return [heading, table('controls', ['kind', 'name', 'mode', 'direction', 'since (UTC)', 'by', 'reason'],
      docs.map(function (d) {
        return el('tr', {'data-control': d.kind + ':' + d.name}, [el('td', {}, [d.kind]),
          el('td', {}, [d.name]), el('td', {}, [d.mode]), el('td', {}, [d.direction]),
          el('td', {}, [when(d.at)]), el('td', {}, [d.by]), el('td', {}, [d.reason])]);
      }))];
  });
}

function agents() {
  return Promise.all([agentRows(), controls()]).then(function (both) {
    return both[0].concat(both[1]);
  });
}

function agentRows() {
  // Every agent instance's heartbeat: how long ago, its last cycle's time and work (the
  // requests of its partition it had to look at: its backlog), and what that cycle did.
  return get(FILES + '/_all_docs', {startkey: 'heartbeat:', endkey: 'heartbeat:\ufff0',
    include_docs: true}).then(function (res) {
    var now = Date.now() / 1000;
    var docs = res.rows.map(function (r) { return r.doc; }).filter(Boolean);
    docs.sort(function (a, b) { return a.agent.localeCompare(b.agent) || a.instance.localeCompare(b.instance); });
    var rows = docs.map(function (d) {
      var state = d.stopped ? 'stopped' : (now - d.last_seen > STALE_AFTER ? 'stale' : 'alive');
      var cycle = d.last_cycle || {};
      var did = Object.keys(cycle).filter(function (k) {
        return k !== 'work' && k !== 'seconds' && cycle[k];
      }).map(function (k) { return k + ' ' + cycle[k]; }).join(', ');
      return el('tr', {'class': state, 'data-instance': d.instance}, [
        el('td', {}, [d.agent]), el('td', {}, [d.instance]), el('td', {}, [d.host]),
        el('td', {}, [when(d.last_seen)]), el('td', {'class': 'n', 'data-column': 'age'},
          [Math.max(0, Math.round(now - d.last_seen))]), el('td', {}, [state]),
        el('td', {'class': 'n', 'data-column': 'cycles'}, [d.cycles]),
        el('td', {'class': 'n', 'data-column': 'seconds'}, [cycle.seconds === undefined ? '' : cycle.seconds]),
        el('td', {'class': 'n', 'data-column': 'work'}, [cycle.work === undefined ? '' : cycle.work]),
        el('td', {}, [did || 'nothing'])
      ]);
    });
    return [el('h2', {}, ['Agents']),
      el('p', {}, ['In red: no heartbeat for ' + STALE_AFTER + ' s; grey: stopped.']),
      table('agents', ['agent', 'instance', 'host', 'last heartbeat (UTC)', 'age (s)', 'state',
        'cycles', 'last cycle (s)', 'backlog (requests)', 'last cycle did'], rows)];
  });
}

function sumOf(states, names) {
  return names.reduce(function (n, s) { return n + (states[s] || 0); }, 0);
}

function liveLinks() {
  // {links: {"SRC>DST": {source, destination, states: {state: files}}}, errors: {link: {class:
  // failed attempts}}} from the live summary (null before the first one).
  return summary('monitor:live:links').then(function (doc) {
    if (!doc) { return null; }
    var links = {};
    Object.keys(doc.links || {}).forEach(function (name) {
      var parts = name.split('>');
      links[name] = {source: parts[0], destination: parts[1], states: doc.links[name]};
    });
    return {links: links, errors: doc.errors || {}};
  });
}

function links() {
  return Promise.all([liveLinks(), history(true)]).then(function (both) {
    var got = both[0], h = both[1];
    if (!got) { return noSummaries(); }
    var all = got.links, errors = got.errors;
    var names = Object.keys(all);
    var sources = [], destinations = [];
    names.forEach(function (n) {
      if (sources.indexOf(all[n].source) < 0) { sources.push(all[n].source); }
      if (destinations.indexOf(all[n].destination) < 0) { destinations.push(all[n].destination); }
    });
    sources.sort(); destinations.sort();
    var matrix = sources.map(function (src) {
      return el('tr', {'data-source': src}, [el('th', {}, [src])].concat(destinations.map(function (dst) {
        var link = all[src + '>' + dst];
        if (!link) { return el('td', {}, ['']); }
        var s = link.states;
        return el('td', {'data-link': src + '>' + dst, 'class': 'n'}, [
          el('a', {href: '#link/' + encodeURIComponent(src + '>' + dst)},
            [(s.done || 0) + ' / ' + sumOf(s, STATES.failing) + ' / ' + sumOf(s, STATES.in_flight)])]);
      })));
    });
    var ranked = names.map(function (n) {
      var s = all[n].states, done = s.done || 0, failed = sumOf(s, STATES.failing);
      return {name: n, done: done, failed: failed,
        ratio: done + failed ? failed / (done + failed) : 0};
    }).sort(function (a, b) { return b.ratio - a.ratio || a.name.localeCompare(b.name); });
    var WORST = 50; // the worst links are what an operator looks for
    var worst = ranked.slice(0, WORST).map(function (l) {
      var classes = errors[l.name] || {};
      var top = Object.keys(classes).sort(function (a, b) { return classes[b] - classes[a]; })
        .slice(0, 3).map(function (c) { return c + ' ' + classes[c]; }).join(', ');
      return el('tr', {'data-link': l.name}, [
        el('td', {}, [el('a', {href: '#link/' + encodeURIComponent(l.name)}, [l.name])]),
        el('td', {'class': 'n'}, [l.done]), el('td', {'class': 'n'}, [l.failed]),
        el('td', {'class': 'n'}, [(100 * l.ratio).toFixed(1) + ' %']), el('td', {}, [top])]);
    });
    return [el('h2', {}, ['Links: done / failed / active']),
      table('matrix', ['source \\ destination'].concat(destinations), matrix),
      el('h2', {}, ['Worst links first' + (ranked.length > WORST ? ' (' + WORST + ' of ' +
        ranked.length + ')' : '')]),
      table('worst', ['link', 'done', 'failed', 'failure ratio',
        'top error classes (failed attempts)'], worst)].concat(h ? linksInWindow(h) : []);
  });
}

function copyRate(figures) {
  // The copies' own transfer rate: bytes done over the seconds those copies took (each from
  // its attempt's submission to its end); null when no copy records its time.
  return figures[3] ? figures[1] / figures[3] : null;
}

function rateCell(v) {
  return el('td', {'class': 'n', 'data-column': 'copy-rate', 'data-value': v === null ? '' : v},
    [v === null ? '' : rate(v)]);
}

function linksInWindow(h) {
  // Each link's copies, throughput and success rate over the window (the summaries' hours),
  // the links with most failed attempts first.
  var figures = windowLinks(h), seconds = WINDOWS[view.window][1];
  var names = Object.keys(figures).sort(function (a, b) {
    return figures[b][2] - figures[a][2] || figures[b][1] - figures[a][1] || a.localeCompare(b);
  });
  var rows = names.slice(0, 50).map(function (name) {
    var f = figures[name];
    return el('tr', {'data-link': name}, [el('td', {}, [el('a', {href: '#link/' + encodeURIComponent(name) +
      (view.window !== DEFAULT_VIEW.window ? '?window=' + view.window : '')}, [name])]),
      el('td', {'class': 'n', 'data-column': 'done'}, [f[0]]),
      el('td', {'class': 'n', 'data-column': 'bytes', 'data-value': f[1]}, [bytes(f[1])]),
      el('td', {'class': 'n', 'data-column': 'throughput', 'data-value': f[1] / seconds}, [rate(f[1] / seconds)]),
      rateCell(copyRate(f)),
      el('td', {'class': 'n', 'data-column': 'failed'}, [f[2]]),
      el('td', {'class': 'n', 'data-column': 'success'}, [percent(successRate(f))])]);
  });
  return [el('h2', {}, ['Links over the window (' + WINDOWS[view.window][0] +
    (names.length > 50 ? '; the 50 with most failures of ' + names.length : '') + ')']), choices(false),
    rows.length ? table('links-window', ['link', 'copies done', 'bytes done', 'throughput (window average)',
      'transfer rate of the copies', 'failed attempts', 'success rate'], rows) : el('p', {id: 'links-window'}, ['nothing ended in the window'])];
}

function windowFailures(got) {
  // Every failure pattern of the window: [{link, cls, pattern, count, first, last, samples}],
  // the most frequent first.
  var all = emptyBucket(0);
  got.buckets.forEach(function (b) { addDetail(all, {failures: b.failures}); });
  var rows = [];
  eachFailure(all.failures, function (link, cls, pattern, e) {
    rows.push({link: link, cls: cls, pattern: pattern, count: e[0], first: e[1], last: e[2], samples: e[3]});
  });
  rows.sort(function (a, b) { return b.count - a.count || a.link.localeCompare(b.link) || a.pattern.localeCompare(b.pattern); });
  return rows;
}

function windowLinks(got) {
  // link → [copies done, bytes done, failed attempts, transfer seconds] over the window.
  var all = emptyBucket(0);
  got.buckets.forEach(function (b) { addDetail(all, {link_hours: b.links}); });
  return all.links;
}

function successRate(figures) {
  // Copies done out of the attempts that ended (done + failed), in %; null when none ended.
  var ended = figures[0] + figures[2];
  return ended ? 100 * figures[0] / ended : null;
}

function percent(v) { return v === null ? '' : v.toFixed(1) + ' %'; }

// How the errors page groups failures: the address's `group`.
var GROUPS = {link: 'link', source: 'source site', destination: 'destination site', 'class': 'error class'};

function groupOf(row, group) {
  var ends = row.link.split('>');
  return {link: row.link, source: ends[0], destination: ends[1], 'class': row.cls}[group];
}

function classesText(classes) {
  return Object.keys(classes).sort(function (a, b) { return classes[b] - classes[a]; })
    .map(function (c) { return c + ' ' + classes[c]; }).join(', ');
}

function errors() {
  // Failed attempts of the window grouped by link, site or class (each group a filter), then
  // each message pattern with its count, first and last seen, and sample files.
  return history(true).then(function (got) {
    if (!got) { return noSummaries(); }
    var group = GROUPS[PARAMS.group] ? PARAMS.group : 'link';
    var filters = {link: PARAMS.link || '', site: PARAMS.site || '', 'class': PARAMS['class'] || ''};
    var rows = windowFailures(got).filter(function (r) {
      return (!filters.link || r.link === filters.link) && (!filters['class'] || r.cls === filters['class']) &&
        (!filters.site || r.link.split('>').indexOf(filters.site) >= 0);
    });
    var totals = {};
    rows.forEach(function (r) {
      var g = groupOf(r, group);
      var t = totals[g] = totals[g] || {count: 0, classes: {}, first: r.first, last: r.last};
      t.count += r.count;
      t.classes[r.cls] = (t.classes[r.cls] || 0) + r.count;
      t.first = Math.min(t.first, r.first); t.last = Math.max(t.last, r.last);
    });
    var filterOf = {link: 'link', source: 'site', destination: 'site', 'class': 'class'}[group];
    var groupRows = Object.keys(totals).sort(function (a, b) {
      return totals[b].count - totals[a].count || a.localeCompare(b);
    }).map(function (g) {
      var t = totals[g], change = {};
      change[filterOf] = g;
      return el('tr', {'data-group': g, 'data-first': t.first, 'data-last': t.last}, [el('td', {}, [el('a', {href: addressWith(change)}, [g])]),
        el('td', {'class': 'n', 'data-column': 'count'}, [t.count]), el('td', {}, [classesText(t.classes)]),
        el('td', {'data-column': 'first'}, [when(t.first)]), el('td', {'data-column': 'last'}, [when(t.last)])]);
    });
    var SHOWN = 200;
    var detail = rows.slice(0, SHOWN).map(function (r) {
      return el('tr', {'data-link': r.link, 'data-class': r.cls, 'data-first': r.first, 'data-last': r.last}, [
        el('td', {}, [el('a', {href: '#link/' + encodeURIComponent(r.link)}, [r.link])]),
        el('td', {}, [r.cls]), el('td', {'class': 'n', 'data-column': 'count'}, [r.count]),
        el('td', {'class': 'pattern'}, [r.pattern]), el('td', {'data-column': 'first'}, [when(r.first)]),
        el('td', {'data-column': 'last'}, [when(r.last)]),
        el('td', {}, r.samples.map(function (id, i) {
          return el('span', {}, [i ? ' ' : '', el('a', {href: '#file/' + encodeURIComponent(id), 'class': 'sample'},
            ['file ' + (i + 1)])]);
        }))]);
    });
    var groupSelect = el('select', {id: 'group'}, Object.keys(GROUPS).map(function (g) {
      var opt = el('option', {value: g}, [GROUPS[g]]);
      if (g === group) { opt.setAttribute('selected', 'selected'); }
      return opt;
    }));
    groupSelect.addEventListener('change', function () { setParam('group', groupSelect.value); });
    var active = Object.keys(filters).filter(function (k) { return filters[k]; }).map(function (k) {
      var clear = {};
      clear[k] = '';
      return el('span', {'class': 'filter', 'data-filter': k}, [k + ' = ' + filters[k] + ' ',
        el('a', {href: addressWith(clear), title: 'remove this filter'}, ['×']), ' ']);
    });
    var total = rows.reduce(function (n, r) { return n + r.count; }, 0);
    return [el('h2', {}, ['Errors: failed attempts (' + WINDOWS[view.window][0] + ')']), choices(false),
      el('p', {'class': 'choices'}, ['grouped by ', groupSelect].concat(active.length ? [' — filters: '].concat(active) : [])),
      el('p', {id: 'errors-total'}, [total + ' failed attempts, ' + rows.length + ' distinct messages']),
      groupRows.length ? table('error-groups', [GROUPS[group], 'failed attempts', 'error classes', 'first seen (UTC)', 'last seen (UTC)'], groupRows)
        : el('p', {id: 'error-groups'}, ['none']),
      el('h2', {}, ['Messages' + (rows.length > SHOWN ? ' (the ' + SHOWN + ' most frequent of ' + rows.length + ')' : '')]),
      detail.length ? table('error-messages', ['link', 'error class', 'failed attempts', 'message (what varies: <url>, <path>, <id>, <n>)',
        'first seen (UTC)', 'last seen (UTC)', 'sample files'], detail) : el('p', {id: 'error-messages'}, ['none'])];
  });
}

function link(name) {
  // One link: its files per state and its tasks (the `links` view, one key range); over the
  // window, its throughput and success rate per hour (or day) and its error messages (the
  // monitoring summaries).
  var parts = name.split('>');
  if (parts.length !== 2) { return Promise.reject(new NotFound('A link is named SOURCE>DESTINATION, not ' + name + '.')); }
  return Promise.all([
    get(DDOC + 'links', {start_key: [parts[0], parts[1]], end_key: [parts[0], parts[1], {}], group_level: 4}),
    history(true)
  ]).then(function (got) {
    if (!got[0].rows.length) { throw new NotFound('No files go from ' + parts[0] + ' to ' + parts[1] + '.'); }
    var states = got[0].rows.filter(function (r) { return r.key[2] === 'state'; });
    var tasks = got[0].rows.filter(function (r) { return r.key[2] === 'task'; });
    var stateRows = states.map(function (r) {
      return el('tr', {'data-state': r.key[3]}, [el('td', {}, [r.key[3]]), el('td', {'class': 'n'}, [r.value])]);
    });
    var taskRows = tasks.map(function (r) {
      return el('tr', {'data-task': r.key[3]}, [
        el('td', {}, [el('a', {href: '#task/' + encodeURIComponent(r.key[3])}, [r.key[3]])]),
        el('td', {'class': 'n'}, [r.value])]);
    });
    var out = [el('h2', {}, ['Link ' + parts[0] + ' → ' + parts[1]]),
      table('link-states', ['state', 'files now'], stateRows)].concat(countedAgo('link-counted', got[0]));
    var h = got[1];
    if (h) {
      var step = h.span.step, per = step === DAY ? 'day' : 'hour';
      var figures = function (b) { return b.links[name] || [0, 0, 0, 0]; };
      out.push(el('h2', {}, ['Throughput and success rate (' + WINDOWS[view.window][0] + ')']), choices(false),
        timeChart(h, {id: 'link-chart', title: 'throughput of done copies (average over each ' + per + ')',
          format: function (v) { return rate(v); },
          stacks: [{key: 'throughput', colour: COLOURS.done, value: function (b) { return figures(b)[1] / step; }}],
          line: {key: 'success', colour: '#c33', top: 100, label: 'success rate (% of attempts ended, right axis)',
            value: function (b) { return successRate(figures(b)); }, format: function (v) { return v + ' %'; }}}),
        el('p', {'class': 'note'}, ['The throughput above is the bytes copied in each ' + per + ' over the ' +
          per + '\'s length; the copies\' own transfer rate (below) is the same bytes over the seconds ' +
          'those copies took, each from its attempt\'s submission to its end.']),
        timeChart(h, {id: 'link-rate-chart', title: 'transfer rate of the copies done in each ' + per,
          format: function (v) { return rate(v); },
          stacks: [{key: 'copy-rate', label: 'transfer rate of the copies (bytes / their seconds)', colour: '#37a',
            value: function (b) { return copyRate(figures(b)) || 0; }}]}));
      var hourly = h.buckets.filter(function (b) { var f = figures(b); return f[0] || f[2]; }).map(function (b) {
        var f = figures(b), rate_ = f[1] / step;
        return el('tr', {'data-hour': h.label(b.start)}, [el('td', {}, [h.label(b.start)]),
          el('td', {'class': 'n', 'data-column': 'done'}, [f[0]]),
          el('td', {'class': 'n', 'data-column': 'bytes', 'data-value': f[1]}, [bytes(f[1])]),
          el('td', {'class': 'n', 'data-column': 'throughput', 'data-value': rate_}, [rate(rate_)]),
          rateCell(copyRate(f)),
          el('td', {'class': 'n', 'data-column': 'failed'}, [f[2]]),
          el('td', {'class': 'n', 'data-column': 'success'}, [percent(successRate(f))])]);
      });
      out.push(hourly.length ? table('link-hourly', [per + ' (UTC)', 'copies done', 'bytes done',
        'throughput (' + per + ' average)', 'transfer rate of the copies', 'failed attempts', 'success rate'], hourly)
        : el('p', {id: 'link-hourly'}, ['nothing ended on this link in the window']));
      var messages = windowFailures(h).filter(function (r) { return r.link === name; }).slice(0, 10).map(function (r) {
        return el('tr', {'data-class': r.cls}, [el('td', {}, [r.cls]), el('td', {'class': 'n'}, [r.count]),
          el('td', {'class': 'pattern'}, [r.pattern]), el('td', {}, [when(r.last)])]);
      });
      out.push(el('h2', {}, ['Top errors (', el('a', {href: '#errors?link=' + encodeURIComponent(name) +
        (view.window !== DEFAULT_VIEW.window ? '&window=' + view.window : '')}, ['all']), ')']),
        messages.length ? table('link-errors', ['error class', 'failed attempts', 'message', 'last seen (UTC)'], messages)
          : el('p', {id: 'link-errors'}, ['none']));
    }
    out.push(el('h2', {}, ['Tasks with files on this link']), table('link-tasks', ['task', 'files'], taskRows));
    return out;
  });
}

function users() {
  return summary('monitor:live:users').then(function (doc) {
    if (!doc) { return noSummaries(); }
    var byUser = doc.users || {}, states = [];
    Object.keys(byUser).forEach(function (u) {
      Object.keys(byUser[u]).forEach(function (s) {
        if (states.indexOf(s) < 0 && s !== BYTES_DONE) { states.push(s); }
      });
    });
    states.sort();
    var rows = Object.keys(byUser).sort().map(function (u) {
      var total = states.reduce(function (n, s) { return n + (byUser[u][s] || 0); }, 0);
      return el('tr', {'data-user': u}, [el('td', {}, [el('a', {href: '#user/' + encodeURIComponent(u)}, [u])])].concat(states.map(function (s) {
        return el('td', {'class': 'n', 'data-state': s}, [byUser[u][s] || 0]);
      })).concat([el('td', {'class': 'n', 'data-state': 'total'}, [total]),
        el('td', {'class': 'n', 'data-column': 'bytes', 'data-value': byUser[u][BYTES_DONE] || 0},
          [bytes(byUser[u][BYTES_DONE] || 0)])]));
    });
    return [el('h2', {}, ['Users: files per state']),
      el('p', {}, ['as of ' + when(doc.as_of) + ' UTC; each name opens the user\'s page.']),
      table('users', ['user'].concat(states, ['total', 'bytes copied (files done)']), rows)];
  });
}

var USER_TASK_ROWS = 300; // grouped rows (a task's state) read per page of a user's tasks
var USER_FAILURES = 100;  // failing files per page of a user's failures

function userAddress(name, params) {
  var query = Object.keys(params).filter(function (k) { return params[k]; })
    .map(function (k) { return k + '=' + encodeURIComponent(params[k]); }).join('&');
  return '#user/' + encodeURIComponent(name) + (query ? '?' + query : '');
}

function userTasks(name) {
  // Every task the user has files of, newest first (CRAB's task names begin with when they
  // were made), with its files per state: the users/tasks view grouped over the user's key
  // range, a page at a time (?tasks_from=TASK: the page that begins with that task).
  var from = PARAMS.tasks_from || '';
  return get(USERS_VIEWS + 'tasks', {start_key: from ? [name, from, {}] : [name, {}], end_key: [name],
    descending: true, group_level: 3, limit: USER_TASK_ROWS}).then(function (res) {
    var order = [], tasks = {};
    res.rows.forEach(function (r) {
      var t = r.key[1];
      if (!tasks[t]) { tasks[t] = {}; order.push(t); }
      tasks[t][r.key[2]] = r.value;
    });
    var next = '';
    if (res.rows.length >= USER_TASK_ROWS && order.length > 1) {
      next = order.pop(); // perhaps cut short: it begins the next page
    }
    var states = [];
    order.forEach(function (t) {
      Object.keys(tasks[t]).forEach(function (st) { if (states.indexOf(st) < 0) { states.push(st); } });
    });
    states.sort();
    var rows = order.map(function (t) {
      var files = Object.keys(tasks[t]).reduce(function (n, st) { return n + tasks[t][st]; }, 0);
      return el('tr', {'data-task': t}, [el('td', {}, [el('a', {href: '#task/' + encodeURIComponent(t)}, [t])]),
        el('td', {'class': 'n', 'data-column': 'files'}, [files])].concat(states.map(function (st) {
        var n = tasks[t][st] || 0;
        return el('td', {'class': 'n', 'data-state': st}, [n ? el('a', {href: taskAddress(t, {state: st})}, [String(n)]) : '0']);
      })));
    });
    var nav = [];
    if (from) { nav.push(el('a', {href: userAddress(name, {failures_from: PARAMS.failures_from}), id: 'tasks-newest'}, ['← newest tasks']), ' '); }
    if (next) { nav.push(el('a', {href: userAddress(name, {tasks_from: next, failures_from: PARAMS.failures_from}), id: 'tasks-older'}, ['older tasks →'])); }
    return {count: order.length, nodes: [el('h2', {}, ['Tasks (every task with files here, newest first' +
      (from || next ? '; ' + order.length + ' on this page' : '') + ')']),
      rows.length ? table('user-tasks', ['task', 'files'].concat(states), rows) : el('p', {id: 'user-tasks'}, ['none']),
      el('p', {'class': 'pager'}, nav)]};
  });
}

function userFailures(name) {
  // The user's failing files (state a current failure: STATES.current_failures), the last
  // changed first, with class and reason, each linked to its page: the users/failures view by
  // the user's key range (?failures_from=[time, id]: the page that begins with that file).
  var from = null;
  try { from = PARAMS.failures_from ? JSON.parse(PARAMS.failures_from) : null; } catch (e) { from = null; }
  if (!Array.isArray(from) || from.length !== 2) { from = null; }
  return get(USERS_VIEWS + 'failures', {start_key: from ? [name].concat(from) : [name, {}], end_key: [name],
    descending: true, limit: USER_FAILURES + 1}).then(function (res) {
    var shown = res.rows.slice(0, USER_FAILURES);
    // The next page starts at its first row's [time, id], the time from the row's value: the
    // key's is inexact on the embedded store (docs/store-quirks.md EMBEDDED_VIEW_KEYS_INEXACT).
    var first = res.rows[USER_FAILURES];
    var next = first ? JSON.stringify([first.value.at, first.id]) : '';
    var rows = shown.map(function (r) {
      var v = r.value, lfn = v.destination_lfn || '';
      return el('tr', {'data-id': r.id, 'data-state': v.state}, [el('td', {}, [when(v.at)]),
        el('td', {}, [el('a', {href: '#task/' + encodeURIComponent(v.task)}, [v.task])]),
        el('td', {'class': 'n'}, [v.job_id]),
        el('td', {}, [el('a', {href: '#file/' + encodeURIComponent(r.id), title: lfn, 'class': 'file'},
          [lfn.slice(lfn.lastIndexOf('/') + 1) || r.id])]),
        el('td', {}, [v.source + ' → ' + v.destination]), el('td', {'data-column': 'state'}, [v.state]),
        el('td', {'class': 'n', 'data-column': 'attempts'}, [v.attempts]),
        el('td', {'data-column': 'class'}, [v.error_class || '']), el('td', {'data-column': 'reason'}, [v.reason || ''])]);
    });
    var nav = [];
    if (from) { nav.push(el('a', {href: userAddress(name, {tasks_from: PARAMS.tasks_from}), id: 'failures-newest'}, ['← last failures']), ' '); }
    if (next) { nav.push(el('a', {href: userAddress(name, {tasks_from: PARAMS.tasks_from, failures_from: next}), id: 'failures-older'}, ['older failures →'])); }
    return {count: shown.length, nodes: [el('h2', {}, ['Failures (files whose state is a failure now: ' +
      STATES.current_failures.join(', ') + '; the last changed first)']),
      rows.length ? table('user-failures', ['last change (UTC)', 'task', 'job', 'file (its page)', 'link', 'state',
        'attempts', 'error class', 'reason'], rows) : el('p', {id: 'user-failures'}, ['none']),
      el('p', {'class': 'pager'}, nav)]};
  });
}

function user(name) {
  // One user: their files per state and bytes copied (live summary), every task they have
  // files of (userTasks), their failing files (userFailures), and the tasks they were active
  // in over the last 24 hours (the live summary's task tallies, which record each task's user).
  return Promise.all([summary('monitor:live:users'), summary('monitor:live'), userTasks(name),
    userFailures(name)]).then(function (got) {
    var allTasks = got[2], failures = got[3];
    var mine = got[0] ? (got[0].users || {})[name] : null;
    var tasks = {}, other = {};
    Object.keys((got[1] || {}).tasks || {}).forEach(function (t) {
      if (got[1].tasks[t]['user:' + name]) { tasks[t] = got[1].tasks[t]; }
    });
    var folded = ((got[1] || {}).tasks_other || {})[name];
    if (folded) { other[name] = folded; }
    if (!mine && !Object.keys(tasks).length && !allTasks.count && !failures.count) {
      throw new NotFound('No user called ' + name + ' has files here.');
    }
    var head = [el('h2', {}, ['User ' + name])];
    if (!got[0] || !got[1]) {
      return head.concat(noSummaries(), allTasks.nodes, failures.nodes);
    }
    mine = mine || {};
    var copied = mine[BYTES_DONE] || 0;
    var states = Object.keys(mine).filter(function (s) { return s !== BYTES_DONE; });
    var total = states.reduce(function (n, s) { return n + mine[s]; }, 0);
    var rows = states.sort().map(function (s) {
      return el('tr', {'data-state': s}, [el('td', {}, [s]), el('td', {'class': 'n'}, [mine[s]])]);
    });
    rows.push(el('tr', {'data-state': 'total'}, [el('th', {}, ['total']), el('td', {'class': 'n'}, [total])]));
    var failing = sumOf(mine, STATES.failing), inFlight = sumOf(mine, STATES.on_its_way);
    var saved = view;
    view = {window: '24h', unit: 'files', until: ''};
    var active = activeTasks({tasks: tasks, other: other});
    view = saved;
    active[0].textContent = 'Tasks active in the last 24 hours';
    active[active.length - 1].setAttribute('id', 'user-active');
    return head.concat([
      el('p', {id: 'user-summary', 'data-bytes': copied}, [total + ' files: ' + (mine.done || 0) +
        ' done (' + bytes(copied) + ' copied), ' + inFlight + ' on their way, ' + failing +
        ' failed or failing (as of ' + when(got[0].as_of) + ' UTC)']),
      table('user-states', ['state', 'files'], rows)], allTasks.nodes, failures.nodes, active);
  });
}

function publication() {
  var ends = STATES.publication_ends;
  var outcomes = history().then(function (got) {
    if (!got) { return [got, null]; }
    return windowTasks(got).then(function (active) { return [got, active]; });
  }).then(function (both) {
    var got = both[0], active = both[1];
    if (!got) { return noSummaries(); }
    var tasks = {}, listed = active ? active.tasks : {};
    Object.keys(listed).forEach(function (t) {
      ends.forEach(function (e) {
        var n = listed[t]['publication:' + e] || 0;
        if (n) { tasks[t] = tasks[t] || {}; tasks[t][e] = n; }
      });
    });
    var taskRows = Object.keys(tasks).sort().map(function (t) {
      return el('tr', {'data-task': t}, [el('td', {}, [el('a', {href: '#task/' +
        encodeURIComponent(t)}, [t])])].concat(ends.map(function (e) {
        return el('td', {'class': 'n', 'data-state': e}, [tasks[t][e] || 0]);
      })));
    });
    var folded = foldedTotals(active ? active.other : {});
    if (ends.some(function (e) { return folded['publication:' + e]; })) {  // the summaries' folded tasks
      taskRows.push(el('tr', {'data-task': '', id: 'publication-folded-row'}, [el('th', {}, ['other tasks (' +
        folded.tasks + ')'])].concat(ends.map(function (e) {
        return el('td', {'class': 'n', 'data-state': e}, [folded['publication:' + e] || 0]);
      }))));
    }
    var rows = got.buckets.filter(function (b) {
      var e = endsOf(b.moves, 'publication');
      return ends.some(function (end) { return e[end]; });
    }).map(function (b) {
      var e = endsOf(b.moves, 'publication');
      return el('tr', {'data-hour': got.label(b.start)}, [el('td', {}, [got.label(b.start)])].concat(ends.map(function (end) {
        return el('td', {'class': 'n', 'data-end': end}, [(e[end] || {}).files || 0]);
      })));
    });
    return [el('h2', {}, ['Publication outcomes per task (' + WINDOWS[view.window][0] + ')']), choices(false),
      table('publication-tasks', ['task'].concat(ends), taskRows),
      el('h2', {}, ['Publication outcomes per ' + (got.span.step === DAY ? 'day' : 'hour')]),
      svgChart(got, 'publication-chart', 'publication', ends, 'files'),
      table('publication-hourly', ['UTC'].concat(ends), rows)];
  });
  return Promise.all([outcomes, publicationBlocks()]).then(function (parts) {
    return parts[0].concat(parts[1]);
  });
}

// Files read of each of publication_blocks' ranges (pending; publication_error..failed) at each
// refresh: how many files a user marks for publication is the user's to choose (10,000 of
// alice's, 14 MB at every refresh, had held the store up to 21 s).
var BLOCK_ROWS = 1000;
var PUBLISHED_ROWS = 1000; // the most recently published files read

function publicationBlocks() {
  // Blocks from the publication_blocks view, three key ranges of BLOCK_ROWS (PUBLISHED_ROWS)
  // files at most: pending, the files waiting for a block per user and dataset (open);
  // publication_error..publication_failed, the failed blocks with the catalog's reason (and
  // each failed file); and the blocks published last.
  return Promise.all([
    get(DDOC + 'publication_blocks', {start_key: ['pending'], end_key: ['pending', {}], limit: BLOCK_ROWS}),
    get(DDOC + 'publication_blocks', {start_key: ['publication_error'], end_key: ['publication_failed', {}], limit: BLOCK_ROWS}),
    get(DDOC + 'publication_blocks', {start_key: ['published', {}], end_key: ['published'],
      descending: true, limit: PUBLISHED_ROWS})
  ]).then(function (got) {
    var open = {}, blocks = {}, failedFiles = [];
    got[0].rows.concat(got[1].rows).forEach(function (r) {
      var state = r.key[0], v = r.value;
      if (state === 'pending') {
        var k = v.user + '\u0000' + v.dataset;
        var o = open[k] = open[k] || {user: v.user, dataset: v.dataset, files: 0, bytes: 0, oldest: v.done};
        o.files++; o.bytes += v.size || 0; o.oldest = Math.min(o.oldest, v.done);
        return;
      }
      var key = state + '\u0000' + (v.block || v.dataset + '\u0000' + (v.error || ''));
      var b = blocks[key] = blocks[key] || {state: state, dataset: v.dataset, block: v.block, files: 0,
        bytes: 0, attempts: 0, error: v.error, since: v.since, sample: r.id};
      b.files++; b.bytes += v.size || 0; b.attempts = Math.max(b.attempts, v.attempts || 0);
      b.since = Math.min(b.since, v.since);
      failedFiles.push(r);
    });
    var published = {}, order = [];
    got[2].rows.forEach(function (r) {
      var v = r.value, key = v.block || v.dataset;
      if (!published[key]) { published[key] = {dataset: v.dataset, block: v.block, files: 0, bytes: 0, at: r.key[1], sample: r.id}; order.push(key); }
      published[key].files++; published[key].bytes += v.size || 0;
    });
    var now = Date.now() / 1000;
    var openRows = Object.keys(open).sort(function (a, b) { return open[a].oldest - open[b].oldest; }).map(function (k) {
      var o = open[k];
      return el('tr', {'data-dataset': o.dataset}, [el('td', {}, [el('a', {href: '#user/' + encodeURIComponent(o.user)}, [o.user])]),
        el('td', {}, [o.dataset]), el('td', {'class': 'n', 'data-column': 'files'}, [o.files]),
        el('td', {'class': 'n', 'data-value': o.bytes}, [bytes(o.bytes)]),
        el('td', {'class': 'n'}, [Math.round((now - o.oldest) / 60)])]);
    });
    var blockRow = function (b) {
      return el('tr', {'data-state': b.state, 'data-block': b.block || ''}, [el('td', {}, [b.state]),
        el('td', {}, [b.dataset]), el('td', {'class': 'block'}, [b.block ? b.block.slice(b.block.indexOf('#') + 1) : '(no block)']),
        el('td', {'class': 'n', 'data-column': 'files'}, [b.files]), el('td', {'class': 'n', 'data-value': b.bytes}, [bytes(b.bytes)]),
        el('td', {'class': 'n'}, [b.attempts]), el('td', {}, [when(b.since)]), el('td', {}, [b.error || '']),
        el('td', {}, [el('a', {href: '#file/' + encodeURIComponent(b.sample)}, ['a file'])])]);
    };
    var states = function (wanted) {
      return Object.keys(blocks).filter(function (k) { return wanted.indexOf(blocks[k].state) >= 0; })
        .sort(function (a, b) { return blocks[b].files - blocks[a].files; }).map(function (k) { return blockRow(blocks[k]); });
    };
    var failedRows = failedFiles.map(function (r) {
      return el('tr', {'data-id': r.id}, [el('td', {}, [el('a', {href: '#task/' + encodeURIComponent(r.value.task)}, [r.value.task])]),
        el('td', {}, [r.value.job_id]), el('td', {}, [el('a', {href: '#file/' + encodeURIComponent(r.id)}, [r.key[0]])]),
        el('td', {'class': 'n'}, [r.value.attempts]), el('td', {}, [r.value.error || ''])]);
    });
    var publishedRows = order.map(function (k) {
      var b = published[k];
      return el('tr', {'data-block': b.block || ''}, [el('td', {}, [when(b.at)]), el('td', {}, [b.dataset]),
        el('td', {'class': 'block'}, [b.block ? b.block.slice(b.block.indexOf('#') + 1) : '']),
        el('td', {'class': 'n', 'data-column': 'files'}, [b.files]), el('td', {'class': 'n', 'data-value': b.bytes}, [bytes(b.bytes)]),
        el('td', {}, [el('a', {href: '#file/' + encodeURIComponent(b.sample)}, ['a file'])])]);
    });
    var blockHeaders = ['state', 'dataset', 'block', 'files', 'bytes', 'attempts', 'since (UTC)', 'reason', ''];
    var orNone = function (id, headers, rows) { return rows.length ? table(id, headers, rows) : el('p', {id: id}, ['none']); };
    var cut = function (res) { return res.rows.length >= BLOCK_ROWS ? ' (the first ' + BLOCK_ROWS + ' files)' : ''; };
    return [
      el('h2', {}, ['Open blocks: files waiting for their block to close' + cut(got[0])]),
      orNone('blocks-open', ['user', 'dataset', 'files', 'bytes', 'oldest waits (min)'], openRows),
      el('h2', {}, ['Failed blocks (publication_error: tried again; publication_failed: given up, `aso publish --retry TASK`)' + cut(got[1])]),
      orNone('blocks-failed', blockHeaders, states(STATES.publication_failures)),
      el('h2', {}, ['Blocks published last (the last ' + PUBLISHED_ROWS + ' files)']),
      orNone('blocks-published', ['published (UTC)', 'dataset', 'block', 'files', 'bytes', ''], publishedRows),
      el('h2', {}, ['Failed publications, file by file' + cut(got[1])]),
      orNone('publication-failed', ['task', 'job', 'state', 'attempts', 'reason'], failedRows)];
  });
}

var TASK_PAGE = 500; // file rows per page of a task

var TASK_SCAN = 1000; // by_task rows of one read of the task page
var TASK_SCANS = 5; // reads of one task page at most: a task's size is its user's to choose

function taskRows(name, from, filter) {
  // One page of a task's files from the key `from` (or the task's start), of state `filter`
  // if given: by_task read TASK_SCAN rows at a time until TASK_PAGE are found, the task ends or
  // TASK_SCANS reads are made (a task of 30,000 files read whole at each refresh had held the
  // store for everyone). {rows, next}: next, the key the next page starts at (null: the end).
  var found = [], reads = 0;
  function scan(start) {
    return get(DDOC + 'by_task', {start_key: start, end_key: [name, {}], limit: TASK_SCAN + 1})
      .then(function (got) {
        reads += 1;
        var rows = got.rows.slice(0, TASK_SCAN);
        // A row's key starts the next read, as the status cursor pages by_task (its job is a
        // number of at most 15 digits, exact on both stores: EMBEDDED_VIEW_KEYS_INEXACT is 17).
        var more = got.rows.length > TASK_SCAN ? got.rows[TASK_SCAN].key : null;
        for (var i = 0; i < rows.length; i++) {
          if (filter && rows[i].value.state !== filter) { continue; }
          if (found.length === TASK_PAGE) { return {rows: found, next: rows[i].key}; }
          found.push(rows[i]);
        }
        return more && reads < TASK_SCANS ? scan(more) : {rows: found, next: more};
      });
  }
  return scan(from || [name]);
}

function task(name) {
  // A task: its files per state of each axis at the top (each count filters the list), then its
  // files in job order (numeric), each linked to its page; ?state= keeps the filter, ?from= the
  // page (the by_task key of its first row, JSON).
  var filter = PARAMS.state || '';
  var from = null;
  try { from = PARAMS.from ? JSON.parse(PARAMS.from) : null; } catch (e) { from = null; }
  if (!Array.isArray(from) || from.length !== 4 || from[0] !== name) { from = null; }
  return Promise.all([
    get(DDOC + 'task_states', {start_key: [name], end_key: [name, {}], group_level: 3}),
    taskRows(name, from, filter)
  ]).then(function (got) {
    if (!got[0].rows.length) { throw new NotFound('No files of task ' + name + ' are recorded here.'); }
    var counts = {state: {}, cleanup: {}, publication: {}};
    // Rows of another kind than an axis (the [task, "final", ...] counts) are not shown here.
    got[0].rows.forEach(function (r) { if (counts[r.key[1]]) { counts[r.key[1]][r.key[2]] = r.value; } });
    var countRows = ['state', 'cleanup', 'publication'].map(function (axis) {
      var names = Object.keys(counts[axis]).sort();
      return el('tr', {'data-axis': axis}, [el('th', {}, [axis])].concat([el('td', {}, names.map(function (s, i) {
        var link = el('a', {href: taskAddress(name, axis === 'state' ? {state: s} : {}),
          'data-state': s, 'data-count': counts[axis][s]}, [s + ' ' + counts[axis][s]]);
        return el('span', {}, [i ? ', ' : '', axis === 'state' ? link : s + ' ' + counts[axis][s]]);
      }))]));
    });
    var total = Object.keys(counts.state).reduce(function (n, s) { return n + counts.state[s]; }, 0);
    var matching = filter ? (counts.state[filter] || 0) : total;
    var page = got[1].rows, next = got[1].next;
    var rows = page.map(function (r) {
      var v = r.value, lfn = v.destination_lfn || '';
      return el('tr', {'data-id': r.id, 'data-state': v.state}, [
        el('td', {'class': 'n'}, [v.job_id]), el('td', {}, [r.key[2]]),
        el('td', {}, [el('a', {href: '#file/' + encodeURIComponent(r.id), title: lfn},
          [lfn.slice(lfn.lastIndexOf('/') + 1) || r.id])]),
        el('td', {'class': 'n', 'data-value': v.size}, [bytes(v.size || 0)]),
        el('td', {}, [v.state]), el('td', {}, [v.cleanup]), el('td', {}, [v.publication]),
        el('td', {'class': 'n'}, [v.attempts]), el('td', {}, [when(v.last_update)]),
        el('td', {}, [v.reason ? (v.error_class ? v.error_class + ': ' : '') + v.reason : '']),
        el('td', {'data-column': 'waiting', 'data-why': (v.waiting || {}).why || ''}, [waitingText(v.waiting)])
      ]);
    });
    var select = el('select', {id: 'state-filter'}, [el('option', {value: ''}, ['all states'])].concat(
      Object.keys(counts.state).sort().map(function (s) {
        var opt = el('option', {value: s}, [s]);
        if (s === filter) { opt.setAttribute('selected', 'selected'); }
        return opt;
      })));
    select.addEventListener('change', function () { location.hash = taskAddress(name, {state: select.value}); });
    var nav = [];
    if (from) { nav.push(el('a', {href: taskAddress(name, {state: filter}), id: 'previous'}, ['← first files']), ' '); }
    if (next) { nav.push(el('a', {href: taskAddress(name, {state: filter, from: JSON.stringify(next)}), id: 'next'}, ['next →'])); }
    return holdsOf(page).then(function (holds) {
      return [el('h2', {}, ['Task ' + name]),
        table('task-counts', ['axis', 'files per state (' + total + ' in all)'], countRows)].concat(
        countedAgo('task-counted', got[0]), holds, [
        el('p', {'class': 'choices'}, ['show ', select, ' — ' + matching + ' files' +
          (page.length < matching ? ', ' + page.length + ' on this page' : '')]),
        table('files', ['job', 'type', 'file (its page)', 'size', 'state', 'cleanup', 'publication',
          'attempts', 'last change (UTC)', 'current failure', 'waiting'], rows),
        el('p', {}, nav)]);
    });
  });
}

// The holds that keep files of this page waiting (their status rows name them: waiting.hold), as
// a table: where, whose, why, the free space last seen, since when and the next look. A hold
// that cannot be read is left out (the files still say `held`).
function holdsOf(page) {
  var ids = [];
  page.forEach(function (r) {
    var hold = (r.value.waiting || {}).hold;
    if (hold && ids.indexOf(hold) === -1) { ids.push(hold); }
  });
  if (!ids.length) { return Promise.resolve([]); }
  return Promise.all(ids.map(function (id) {
    return get('/' + SETTINGS.files_db + '/' + encodeURIComponent(id)).catch(function () { return null; });
  })).then(function (docs) {
    var rows = docs.filter(function (d) { return d && d.type === 'hold'; }).map(function (d) {
      return el('tr', {'data-hold': d._id, 'data-state': d.state}, [
        el('td', {}, [d.site]), el('td', {}, [d.user]), el('td', {}, [d.state]), el('td', {}, [d.error_class]),
        el('td', {'class': 'n'}, [d.free === null ? '' : bytes(d.free)]), el('td', {'class': 'n'}, [bytes(d.needs)]),
        el('td', {}, [when(d.since)]), el('td', {}, [d.state === 'active' ? when(d.next_check) : '']),
        el('td', {}, [d.reason])]);
    });
    if (!rows.length) { return []; }
    return [el('h3', {}, ['Held: destinations without room or permission for these files']),
      table('holds', ['site', 'user', 'state', 'class', 'free', 'needed', 'since (UTC)', 'next look (UTC)', 'reason'], rows),
      el('p', {}, ['Its user releases a hold (`aso hold release SITE`) or cancels it (`aso hold cancel SITE`).'])];
  });
}

// Why a file on its way waits (the status row's `waiting`: aso/model.py WAITING_WHY), as
// `aso status` words it (aso/model.py WAITING_WORDS, in the design document's settings).
function waitingText(waiting) {
  if (!waiting) { return ''; }
  var words = (SETTINGS.waiting_words || {})[waiting.why] || waiting.why;
  words = [words, 'since ' + when(waiting.since)];
  if (waiting.until) { words.push('until ' + when(waiting.until)); }
  if (waiting.job_id) { words.push('(job ' + waiting.job_id + ')'); }
  if (waiting.hold) { words.push('(' + waiting.hold + ')'); }
  return words.join(' ');
}

function taskAddress(name, params) {
  var query = Object.keys(params).filter(function (k) { return params[k] !== '' && params[k] !== undefined && params[k] !== 0; })
    .map(function (k) { return k + '=' + encodeURIComponent(params[k]); }).join('&');
  return '#task/' + encodeURIComponent(name) + (query ? '?' + query : '');
}

function jobLink(attempt) {
  // The transfer job in the FTS web monitor, when the configuration names its link template.
  var template = (SETTINGS || {}).transfer_job_url;
  if (!template) { return attempt.job_id; }
  return el('a', {href: template.replace('{job_id}', encodeURIComponent(attempt.job_id)),
    'class': 'job', target: '_blank', rel: 'noopener'}, [attempt.job_id]);
}

function file(id) {
  return get(FILES + '/' + encodeURIComponent(id)).catch(function (err) {
    if (err instanceof NotFound) {
      throw new NotFound('No file with id ' + id + ' is recorded here: it was never uploaded, ' +
        'or it ended long enough ago to be purged (the summaries still count it).');
    }
    throw err;
  }).then(function (doc) {
    var rows = (doc.history || []).map(function (h) {
      return el('tr', {}, [el('td', {}, [when(h.at)]), el('td', {}, [h.axis]),
        el('td', {}, [h.from === null ? '' : h.from]), el('td', {}, [h.to]),
        el('td', {}, [h.by]), el('td', {}, [h.reason || ''])]);
    });
    var attempts = (doc.attempts || []).map(function (a, i) {
      return el('tr', {'data-job': a.job_id}, [el('td', {'class': 'n'}, [i + 1]),
        el('td', {}, [jobLink(a)]), el('td', {}, [a.service]), el('td', {}, [when(a.submitted)]),
        el('td', {}, [when(a.ended)]), el('td', {}, [a.outcome || '']),
        el('td', {}, [a.error_class || '']), el('td', {}, [a.reason || ''])]);
    });
    var link = doc.source + '>' + doc.destination;
    return [el('h2', {}, [doc.destination_lfn]),
      el('p', {id: 'file-facts'}, ['task ', el('a', {href: '#task/' + encodeURIComponent(doc.task)}, [doc.task]),
        ', job ' + doc.job_id + ', user ', el('a', {href: '#user/' + encodeURIComponent(doc.user)}, [doc.user]),
        ', link ', el('a', {href: '#link/' + encodeURIComponent(link)}, [doc.source + ' → ' + doc.destination]),
        ', ' + bytes(doc.size || 0) + ' (' + doc.size + ' bytes); now ' + doc.state + ', cleanup ' +
        doc.cleanup + ', publication ' + doc.publication]),
      el('p', {}, ['from ' + doc.source_lfn]),
      el('h2', {}, ['History (each change, by the agent that made it)']),
      table('history', ['time (UTC)', 'axis', 'from', 'to', 'by', 'reason'], rows),
      el('h2', {}, ['Transfer attempts']),
      attempts.length ? table('attempts', ['#', 'transfer job', 'service', 'submitted (UTC)', 'ended (UTC)',
        'outcome', 'error class', 'reason'], attempts) : el('p', {id: 'attempts'}, ['none yet'])];
  });
}

// The pages by the first part of their address.
var PAGES_OF = {overview: overview, links: links, errors: errors, users: users,
  publication: publication, agents: agents, link: link, user: user, task: task, file: file};

function address() {
  // {page, arg, params} of the address: #page/arg?key=value&...
  var raw = location.hash.slice(1), q = raw.indexOf('?'), params = {};
  var path = q < 0 ? raw : raw.slice(0, q);
  (q < 0 ? '' : raw.slice(q + 1)).split('&').forEach(function (pair) {
    if (!pair) { return; }
    var i = pair.indexOf('=');
    params[decodeURIComponent(i < 0 ? pair : pair.slice(0, i))] =
      i < 0 ? '' : decodeURIComponent(pair.slice(i + 1));
  });
  path = decodeURIComponent(path) || 'overview';
  var slash = path.indexOf('/');
  return {page: slash < 0 ? path : path.slice(0, slash), arg: slash < 0 ? '' : path.slice(slash + 1),
    params: params};
}

function addressWith(changes) {
  // This page's address with `changes` to its parameters (an empty value or a default is left
  // out): what a choice or a filter link leads to.
  var a = address();
  Object.keys(changes).forEach(function (k) { a.params[k] = changes[k]; });
  var query = Object.keys(a.params).filter(function (k) {
    return a.params[k] !== '' && a.params[k] !== undefined && DEFAULT_VIEW[k] !== a.params[k];
  }).map(function (k) { return encodeURIComponent(k) + '=' + encodeURIComponent(a.params[k]); });
  return '#' + a.page + (a.arg ? '/' + encodeURIComponent(a.arg) : '') +
    (query.length ? '?' + query.join('&') : '');
}

function setParam(name, value) {
  // A choice made on a page goes into its address: reloads, bookmarks and links keep it.
  var change = {};
  change[name] = value;
  location.hash = addressWith(change);
}

function viewOf(params) {
  return {
    window: WINDOWS[params.window] ? params.window : DEFAULT_VIEW.window,
    unit: params.unit === 'bytes' ? 'bytes' : DEFAULT_VIEW.unit,
    until: /^[0-9]{4}-[0-9]{2}-[0-9]{2}$/.test(params.until || '') ? params.until : ''
  };
}

function session() {
  // {name, roles, how} of whoever the store sees (name null: nobody).
  return fetch('/_session', {credentials: 'same-origin'}).then(function (r) { return r.json(); })
    .then(function (body) {
      var ctx = body.userCtx || {};
      return {name: ctx.name || null, roles: ctx.roles || [], how: (body.info || {}).authenticated};
    });
}

function showWho(who) {
  var place = document.getElementById('who');
  if (!who.name) { place.replaceChildren(); return; }
  var parts = ['logged in as ', el('strong', {}, [who.name])];
  if (who.how === 'cookie') { // a certificate cannot be logged out of from a page
    var out = el('button', {id: 'logout', type: 'button'}, ['log out']);
    out.addEventListener('click', function () {
      fetch('/_session', {method: 'DELETE', credentials: 'same-origin'}).then(function () {
        showWho({name: null});
        show('login', loginPage('Logged out.'));
      });
    });
    parts.push(' ', out);
  }
  place.replaceChildren.apply(place, parts);
}

function loginPage(message) {
  // A store account's name and password, sent to the store's _session: it answers with a
  // session cookie (HttpOnly) that every read of the pages then carries.
  var name = el('input', {id: 'login-name', name: 'name', autocomplete: 'username', required: 'required'});
  var password = el('input', {id: 'login-password', type: 'password', name: 'password',
    autocomplete: 'current-password', required: 'required'});
  var said = el('p', {'class': 'error', id: 'login-message', role: 'alert'}, [message || '']);
  var form = el('form', {id: 'login'}, [
    el('h2', {}, ['Log in']),
    el('p', {}, ['With your account of this store (its name and password). Through the front ' +
      'end, a certificate in your browser logs you in and this page is not shown.']),
    el('p', {}, [el('label', {'for': 'login-name'}, ['name ']), name]),
    el('p', {}, [el('label', {'for': 'login-password'}, ['password ']), password]),
    el('p', {}, [el('button', {type: 'submit', id: 'login-submit'}, ['log in'])]), said]);
  form.addEventListener('submit', function (event) {
    event.preventDefault();
    said.textContent = '';
    fetch('/_session', {method: 'POST', credentials: 'same-origin',
      headers: {'Content-Type': 'application/json', 'Accept': 'application/json'},
      body: JSON.stringify({name: name.value, password: password.value})}).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (body) {
        if (!r.ok) {
          said.textContent = 'Not logged in: ' + (body.reason || 'HTTP ' + r.status);
          return;
        }
        if (address().page === 'login') { location.hash = '#overview'; } else { route(); }
      });
    }).catch(function (err) { said.textContent = 'Not logged in: ' + (err.message || err); });
  });
  return [form];
}

function notFoundPage(message) {
  var pages = Object.keys(PAGES_OF).filter(function (p) {
    return ['link', 'user', 'task', 'file'].indexOf(p) < 0;
  });
  return [el('h2', {}, ['Not found']), el('p', {'class': 'error', id: 'not-found'}, [message]),
    el('p', {}, ['The pages: '].concat(pages.map(function (p, i) {
      return el('span', {}, [i ? ', ' : '', el('a', {href: '#' + p}, [p])]);
    })))];
}

function show(page, nodes) {
  var main = document.getElementById('page');
  main.replaceChildren.apply(main, nodes);
  document.body.setAttribute('data-page', page);
}

var ROUTED = 0; // the latest route()'s number: an earlier one that ends later shows nothing

function route() {
  var mine = ++ROUTED;
  var a = address();
  PARAMS = a.params;
  view = viewOf(a.params);
  var render = PAGES_OF[a.page];
  var shown;
  if (a.page === 'login') {
    shown = session().then(function (who) {
      if (who.name) { location.hash = '#overview'; return null; }
      return loginPage('');
    });
  } else if (!render) {
    shown = Promise.reject(new NotFound('There is no page called "' + a.page + '".'));
  } else {
    // The settings first: every page groups states as they say (STATES).
    shown = settings().then(function () { return render(a.arg); });
  }
  return shown.then(function (nodes) {
    if (!nodes || mine !== ROUTED) { return; }
    show(a.page, nodes);
    document.getElementById('refreshed').textContent = 'as of ' + when(Date.now() / 1000) + ' UTC';
    return session().then(showWho);
  }).catch(function (err) {
    if (mine !== ROUTED) { return; }
    if (err instanceof LoginNeeded) {
      show('login', loginPage(''));
    } else if (err instanceof NotFound) {
      show('not-found', notFoundPage(err.message));
    } else {
      show('error', [el('p', {'class': 'error', id: 'page-error'}, [String(err.message || err)])]);
    }
  });
}

function refresh() {
  // Every REFRESH ms, unless a login is being typed.
  if (document.body.getAttribute('data-page') !== 'login') { route(); }
}

window.addEventListener('hashchange', route);
setInterval(refresh, REFRESH);
route();
