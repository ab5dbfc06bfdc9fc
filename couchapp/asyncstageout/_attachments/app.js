// ASO monitoring: a single page served from the design document, with the reader's own
// credentials (through the front end, or on loopback). Plain JS, no build step.
//
// Figures over all requests come from the monitoring summaries the analytics agent keeps in the
// statistics database (aso/summaries.py): a few small documents per page whatever the number of
// requests, and history that outlives the purge. Pages about one task, link or file read the
// files database (a key range of a view, or one document).
//
// Pages: #overview (files per state now, what ended per hour or day in any window, throughput,
// backlog over time, active tasks), #links (source × destination matrix, worst links with their
// error classes), #link/SRC>DST (its tasks), #users (files per user and state), #publication
// (outcomes per hour and per task, failures), #agents (heartbeats, stale in red),
// #task/NAME (every file of a task), #file/ID (one file's history and transfer attempts).
'use strict';

var DB = location.pathname.split('/')[1];
var DDOC = '/' + DB + '/_design/asyncstageout/_view/';
var STALE_AFTER = 120; // seconds without a heartbeat before an agent is shown as stale
var REFRESH = 30000;
var SETTINGS = null; // the design document's `aso` member: stats_db, transfer_job_url, states
var HOUR = 3600, DAY = 86400;
// The groups of states the pages show: aso/model.py PAGES_STATES, read with SETTINGS.
var STATES = {on_its_way: [], in_flight: [], failing: [], copy_ends: [], publication_ends: []};

function settings() {
  if (SETTINGS) { return Promise.resolve(SETTINGS); }
  return get('/' + DB + '/_design/asyncstageout').then(function (ddoc) {
    SETTINGS = ddoc.aso || {};
    STATES = SETTINGS.states || STATES;
    return SETTINGS;
  });
}

function summary(id) {
  // One monitoring summary document (null until the analytics agent has written it).
  return settings().then(function (s) {
    return fetch('/' + s.stats_db + '/' + encodeURIComponent(id), {credentials: 'same-origin'});
  }).then(function (r) {
    if (r.status === 404) { return null; }
    if (!r.ok) { throw new Error(id + ': HTTP ' + r.status); }
    return r.json();
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
    .then(function (r) {
      if (!r.ok) { throw new Error(path + ': HTTP ' + r.status); }
      return r.json();
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

function table(id, headers, rows) {
  return el('table', {id: id}, [
    el('thead', {}, [el('tr', {}, headers.map(function (h) { return el('th', {}, [h]); }))]),
    el('tbody', {}, rows)
  ]);
}

function when(epoch) {
  return epoch ? new Date(epoch * 1000).toISOString().replace('T', ' ').slice(0, 19) : '';
}

var WINDOWS = {'24 h': 24 * HOUR, '7 days': 7 * DAY, '30 days': 30 * DAY, '1 year': 365 * DAY};
var COLOURS = {done: '#3a7', failed_attempt: '#e93', failed: '#c33', killed: '#888',
  published: '#37a', publication_error: '#e93', publication_failed: '#c33'};
// The overview's choices, kept across refreshes: window, unit, and the window's end ('' = now).
var view = {window: '24 h', unit: 'files', until: ''};

function iso(epoch) { return new Date(epoch * 1000).toISOString(); }

function windowSpan() {
  // {step, starts: bucket starts (epoch), oldest first}: hours up to 7 days, days beyond.
  var length = WINDOWS[view.window];
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

function addMoves(into, moves) {
  Object.keys(moves || {}).forEach(function (axis) {
    into[axis] = into[axis] || {};
    Object.keys(moves[axis]).forEach(function (name) {
      var m = into[axis][name] = into[axis][name] || [0, 0];
      m[0] += moves[axis][name][0]; m[1] += moves[axis][name][1];
    });
  });
}

function history() {
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
    step === DAY ? summaries('monitor:hour:', name(last), name(last) + '\ufff0') : Promise.resolve([])
  ]).then(function (got) {
    var live = got[0];
    if (!live) { return null; }
    var by = {};
    var bucket = function (start) {
      return by[start] = by[start] || {start: start, moves: {}, backlog: null};
    };
    got[1].forEach(function (d) {
      var b = bucket(d.start);
      addMoves(b.moves, d.moves); b.backlog = d.backlog;
    });
    var closedDay = by[last] !== undefined;
    got[3].forEach(function (d) {
      if (!closedDay) { addMoves(bucket(last).moves, d.moves); }
    });
    (live.open || []).forEach(function (h) {
      var start = Math.floor(h.start / step) * step;
      if (start < first || start > last) { return; }
      addMoves(bucket(start).moves, h.moves);
    });
    // The backlog at each bucket's end: a closed bucket says it; otherwise the one before plus
    // what this bucket's moves added to it (open hours, the day so far, or nothing).
    var carry = got[2].rows.length ? got[2].rows[0].doc.backlog : 0;
    var buckets = span.starts.map(function (start) {
      var b = by[start] || {start: start, moves: {}, backlog: null};
      if (start > live.as_of) {
        b.backlog = null; // not yet
      } else {
        if (b.backlog === null) { b.backlog = carry + netBacklog(b.moves); }
        carry = b.backlog;
      }
      return b;
    });
    return {span: span, live: live, buckets: buckets, label: name};
  });
}

function svgChart(got, axis, ends, unit) {
  // Stacked bars, one per bucket, and the backlog as a line: plain SVG, no library.
  var NS = 'http://www.w3.org/2000/svg', width = 720, height = 160, pad = 20;
  var buckets = got.buckets;
  var value = function (b, e) { return (endsOf(b.moves, axis)[e] || {})[unit] || 0; };
  var totals = buckets.map(function (b) {
    return ends.reduce(function (n, e) { return n + value(b, e); }, 0);
  });
  var top = Math.max.apply(null, totals.concat([1]));
  var svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('width', width); svg.setAttribute('height', height + pad);
  svg.setAttribute('id', axis === 'state' ? 'hourly-chart' : 'publication-chart');
  var w = width / buckets.length;
  var per = got.span.step === DAY ? ' per day' : ' per hour';
  buckets.forEach(function (b, i) {
    var y = height;
    ends.forEach(function (e) {
      var v = value(b, e);
      if (!v) { return; }
      var bar = document.createElementNS(NS, 'rect');
      var hgt = v / top * (height - pad);
      y -= hgt;
      bar.setAttribute('x', i * w + 1); bar.setAttribute('width', Math.max(w - 2, 1));
      bar.setAttribute('y', y); bar.setAttribute('height', hgt);
      bar.setAttribute('fill', COLOURS[e] || '#999');
      var title = document.createElementNS(NS, 'title');
      title.textContent = got.label(b.start) + ' UTC ' + e + ' ' + v;
      bar.appendChild(title);
      svg.appendChild(bar);
    });
  });
  if (axis === 'state') {
    var most = Math.max.apply(null, buckets.map(function (b) { return b.backlog || 0; }).concat([1]));
    var points = buckets.filter(function (b) { return b.backlog !== null; }).map(function (b) {
      var i = buckets.indexOf(b);
      return (i * w + w / 2).toFixed(1) + ',' + (height - b.backlog / most * (height - pad)).toFixed(1);
    });
    var line = document.createElementNS(NS, 'polyline');
    line.setAttribute('points', points.join(' ')); line.setAttribute('id', 'backlog-line');
    line.setAttribute('fill', 'none'); line.setAttribute('stroke', '#33c');
    svg.appendChild(line);
  }
  var label = document.createElementNS(NS, 'text');
  label.setAttribute('x', 0); label.setAttribute('y', height + pad - 4);
  label.textContent = got.label(buckets[0].start) + ' … ' + got.label(buckets[buckets.length - 1].start) +
    ' UTC, top ' + top + (unit === 'bytes' ? ' bytes' : ' files') + per +
    (axis === 'state' ? '; blue line: backlog' : '');
  svg.appendChild(label);
  return svg;
}

function choices() {
  var pick = function (name, options) {
    var select = el('select', {id: name}, options.map(function (o) {
      var opt = el('option', {value: o}, [o]);
      if (view[name] === o) { opt.setAttribute('selected', 'selected'); }
      return opt;
    }));
    select.addEventListener('change', function () { view[name] = select.value; route(); });
    return select;
  };
  var until = el('input', {type: 'date', id: 'until', value: view.until});
  until.addEventListener('change', function () { view.until = until.value; route(); });
  return el('p', {}, ['window ', pick('window', Object.keys(WINDOWS)), ' ending ', until,
    ' (empty: now) in ', pick('unit', ['files', 'bytes'])]);
}

function windowTasks(got) {
  // What each task did in a 24-hour window: {task: {"axis:to" or "created": files}}, from the
  // live document when the window ends now, else from the window's hourly task documents;
  // null for longer windows (thousands of tasks may be active in a day).
  if (view.window !== '24 h') { return Promise.resolve(null); }
  if (!view.until) { return Promise.resolve(got.live.tasks || {}); }
  var starts = got.span.starts;
  return summaries('monitor:tasks:', got.label(starts[0]),
    got.label(starts[starts.length - 1]) + '\ufff0').then(function (docs) {
    var tasks = {};
    docs.forEach(function (d) {
      Object.keys(d.tasks).forEach(function (t) {
        tasks[t] = tasks[t] || {};
        Object.keys(d.tasks[t]).forEach(function (k) { tasks[t][k] = (tasks[t][k] || 0) + d.tasks[t][k]; });
      });
    });
    return tasks;
  });
}

function activeTasks(tasks) {
  // Tasks with events in the window: files created, ended and published there.
  if (tasks === null) { return [el('p', {id: 'tasks-note'}, ['Active tasks: choose a 24 h window.'])]; }
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
  var title = 'Active tasks (' + view.window + (names.length > 100 ? ', the 100 busiest of ' +
    names.length : '') + ')';
  return [el('h2', {}, [title]), table('tasks', ['task'].concat(columns.map(function (c) {
    return c.replace('state:', '').replace('publication:', ''); })), rows)];
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
    var ends = STATES.copy_ends;
    var seconds = got.span.step;
    var perBucket = got.buckets.filter(function (b) {
      return Object.keys(endsOf(b.moves, 'state')).some(function (e) { return ends.indexOf(e) >= 0; });
    }).map(function (b) {
      var e = endsOf(b.moves, 'state');
      var cellsOf = ends.map(function (end) {
        return el('td', {'class': 'n', 'data-end': end}, [(e[end] || {})[view.unit] || 0]);
      });
      return el('tr', {'data-hour': got.label(b.start)}, [el('td', {}, [got.label(b.start)])].concat(cellsOf, [
        el('td', {'class': 'n', 'data-end': 'throughput'}, [(((e.done || {}).bytes || 0) / seconds).toFixed(1)]),
        el('td', {'class': 'n', 'data-backlog': ''}, [b.backlog === null ? '' : b.backlog])]));
    });
    var unitName = got.span.step === DAY ? 'day' : 'hour';
    return [el('h2', {}, ['Files per state']),
      el('p', {id: 'as-of'}, ['as of ' + when(live.as_of) + ' UTC (monitoring summaries; ' +
        'backlog ', el('span', {id: 'backlog-now'}, [live.backlog]), ')']),
      table('states', ['state', 'files'], rows),
      el('h2', {}, ['Ended per ' + unitName + ' (' + view.unit + ')']), choices(),
      svgChart(got, 'state', ends, view.unit),
      table('hourly', [unitName + ' (UTC)'].concat(ends, ['throughput (bytes/s)', 'backlog at end']),
        perBucket)].concat(activeTasks(tasks));
  });
}

function agents() {
  return get('/' + DB + '/_all_docs', {startkey: 'heartbeat:', endkey: 'heartbeat:\ufff0',
    include_docs: true}).then(function (res) {
    var now = Date.now() / 1000;
    var rows = res.rows.map(function (r) {
      var d = r.doc;
      var state = d.stopped ? 'stopped' : (now - d.last_seen > STALE_AFTER ? 'stale' : 'alive');
      var last = d.last_cycle ? Object.keys(d.last_cycle).map(function (k) {
        return k + ' ' + d.last_cycle[k];
      }).join(', ') : '';
      return el('tr', {'class': state, 'data-instance': d.instance}, [
        el('td', {}, [d.agent]), el('td', {}, [d.instance]), el('td', {}, [d.host]),
        el('td', {}, [when(d.last_seen)]), el('td', {}, [state]),
        el('td', {'class': 'n'}, [d.cycles]), el('td', {}, [last])
      ]);
    });
    return [el('h2', {}, ['Agents']), table('agents',
      ['agent', 'instance', 'host', 'last heartbeat (UTC)', 'state', 'cycles', 'last cycle'], rows)];
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
  return liveLinks().then(function (got) {
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
        'top error classes (failed attempts)'], worst)];
  });
}

function link(name) {
  var parts = name.split('>');
  return get(DDOC + 'links', {start_key: [parts[0], parts[1], 'task'],
    end_key: [parts[0], parts[1], 'task', {}], group_level: 4}).then(function (res) {
    var rows = res.rows.map(function (r) {
      return el('tr', {'data-task': r.key[3]}, [
        el('td', {}, [el('a', {href: '#task/' + encodeURIComponent(r.key[3])}, [r.key[3]])]),
        el('td', {'class': 'n'}, [r.value])]);
    });
    return [el('h2', {}, ['Link ' + name]), table('link-tasks', ['task', 'files'], rows)];
  });
}

function users() {
  return summary('monitor:live:users').then(function (doc) {
    if (!doc) { return noSummaries(); }
    var byUser = doc.users || {}, states = [];
    Object.keys(byUser).forEach(function (u) {
      Object.keys(byUser[u]).forEach(function (s) {
        if (states.indexOf(s) < 0) { states.push(s); }
      });
    });
    states.sort();
    var rows = Object.keys(byUser).sort().map(function (u) {
      var total = states.reduce(function (n, s) { return n + (byUser[u][s] || 0); }, 0);
      return el('tr', {'data-user': u}, [el('td', {}, [u])].concat(states.map(function (s) {
        return el('td', {'class': 'n', 'data-state': s}, [byUser[u][s] || 0]);
      })).concat([el('td', {'class': 'n', 'data-state': 'total'}, [total])]));
    });
    return [el('h2', {}, ['Users']), table('users', ['user'].concat(states, ['total']), rows)];
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
    var tasks = {};
    Object.keys(active || {}).forEach(function (t) {
      ends.forEach(function (e) {
        var n = active[t]['publication:' + e] || 0;
        if (n) { tasks[t] = tasks[t] || {}; tasks[t][e] = n; }
      });
    });
    var taskRows = Object.keys(tasks).sort().map(function (t) {
      return el('tr', {'data-task': t}, [el('td', {}, [el('a', {href: '#task/' +
        encodeURIComponent(t)}, [t])])].concat(ends.map(function (e) {
        return el('td', {'class': 'n', 'data-state': e}, [tasks[t][e] || 0]);
      })));
    });
    var rows = got.buckets.filter(function (b) {
      var e = endsOf(b.moves, 'publication');
      return ends.some(function (end) { return e[end]; });
    }).map(function (b) {
      var e = endsOf(b.moves, 'publication');
      return el('tr', {'data-hour': got.label(b.start)}, [el('td', {}, [got.label(b.start)])].concat(ends.map(function (end) {
        return el('td', {'class': 'n', 'data-end': end}, [(e[end] || {}).files || 0]);
      })));
    });
    return [el('h2', {}, ['Publication outcomes per task (' + view.window + ')']), choices(),
      table('publication-tasks', ['task'].concat(ends), taskRows),
      el('h2', {}, ['Publication outcomes per ' + (got.span.step === DAY ? 'day' : 'hour')]),
      svgChart(got, 'publication', ends, 'files'),
      table('publication-hourly', ['UTC'].concat(ends), rows)];
  });
  var failed = get(DDOC + 'publication_problems', {}).then(function (res) {
    var rows = res.rows.map(function (r) {
      return el('tr', {'data-id': r.id}, [el('td', {}, [r.key[1]]), el('td', {}, [r.key[2]]),
        el('td', {}, [el('a', {href: '#file/' + r.id}, [r.key[0]])]),
        el('td', {'class': 'n'}, [r.value.attempts]), el('td', {}, [r.value.error || ''])]);
    });
    return [el('h2', {}, ['Failed publications']),
      table('publication-failed', ['task', 'job', 'state', 'attempts', 'reason'], rows)];
  });
  return Promise.all([outcomes, failed]).then(function (parts) {
    return parts[0].concat(parts[1]);
  });
}

function task(name) {
  return get(DDOC + 'by_task', {start_key: [name], end_key: [name, {}]}).then(function (res) {
    if (!res.rows.length) { return [el('p', {}, ['no requests for task ' + name])]; }
    var rows = res.rows.map(function (r) {
      return el('tr', {'data-id': r.id}, [
        el('td', {}, [r.key[1]]), el('td', {}, [r.key[2]]),
        el('td', {}, [el('a', {href: '#file/' + r.id}, [r.value.state])]),
        el('td', {}, [r.value.cleanup]), el('td', {}, [r.value.publication]),
        el('td', {}, [when(r.value.last_update)]), el('td', {}, [r.value.reason || ''])
      ]);
    });
    return [el('h2', {}, ['Task ' + name]), table('files',
      ['job', 'type', 'state', 'cleanup', 'publication', 'last change (UTC)', 'reason'], rows)];
  });
}

function jobLink(attempt) {
  // The transfer job in the FTS web monitor, when the configuration names its link template.
  var template = (SETTINGS || {}).transfer_job_url;
  if (!template) { return attempt.job_id; }
  return el('a', {href: template.replace('{job_id}', encodeURIComponent(attempt.job_id)),
    'class': 'job', target: '_blank', rel: 'noopener'}, [attempt.job_id]);
}

function file(id) {
  return Promise.all([get('/' + DB + '/' + encodeURIComponent(id)), settings()]).then(function (got) {
    var doc = got[0];
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
    return [el('h2', {}, [doc.source_lfn]),
      el('p', {}, ['task ', el('a', {href: '#task/' + doc.task}, [doc.task]), ', job ' + doc.job_id,
        ', ' + doc.source + ' → ' + doc.destination, ', ' + doc.size + ' bytes']),
      table('history', ['time (UTC)', 'axis', 'from', 'to', 'by', 'reason'], rows),
      el('h2', {}, ['Transfer attempts']),
      table('attempts', ['#', 'transfer job', 'service', 'submitted (UTC)', 'ended (UTC)',
        'outcome', 'error class', 'reason'], attempts)];
  });
}

function route() {
  var hash = decodeURIComponent(location.hash.slice(1)) || 'overview';
  var slash = hash.indexOf('/');
  var page = slash < 0 ? hash : hash.slice(0, slash);
  var arg = slash < 0 ? '' : hash.slice(slash + 1);
  var render = {overview: overview, agents: agents, links: links, link: link, users: users,
    publication: publication, task: task, file: file}[page] || overview;
  var main = document.getElementById('page');
  // The settings first: every page groups states as they say (STATES).
  settings().then(function () { return render(arg); }).then(function (nodes) {
    main.replaceChildren.apply(main, nodes);
    document.getElementById('refreshed').textContent = 'as of ' + when(Date.now() / 1000) + ' UTC';
    document.body.setAttribute('data-page', page);
  }).catch(function (err) {
    main.replaceChildren(el('p', {'class': 'error'}, [String(err.message || err)]));
  });
}

window.addEventListener('hashchange', route);
setInterval(route, REFRESH);
route();
