// ASO monitoring: a single page served from the design document, reading the store's views
// with the reader's own credentials (through the front end, or on loopback). Plain JS, no
// build step. Pages: #overview (files per state now, tasks, what ended per hour), #links
// (source × destination matrix, worst links with their error classes), #link/SRC>DST (its
// tasks), #users (files per user and state), #publication (per task, per hour, failures),
// #agents (heartbeats, stale in red), #task/NAME (every file of a task), #file/ID (one
// file's history).
'use strict';

var DB = location.pathname.split('/')[1];
var DDOC = '/' + DB + '/_design/asyncstageout/_view/';
var STALE_AFTER = 120; // seconds without a heartbeat before an agent is shown as stale
var REFRESH = 30000;

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

var WINDOWS = {'24 h': 24, '7 days': 168, '30 days': 720};
var COLOURS = {done: '#3a7', failed_attempt: '#e93', failed: '#c33', killed: '#888',
  published: '#37a', publication_error: '#e93', publication_failed: '#c33'};
var view = {window: '24 h', unit: 'files'}; // the overview's choices, kept across refreshes

function hours(n) {
  // The last n UTC hours, oldest first, as the hourly view writes them ("2026-11-21T13").
  var out = [], now = Date.now();
  for (var i = n - 1; i >= 0; i--) {
    out.push(new Date(now - i * 3600000).toISOString().slice(0, 13));
  }
  return out;
}

function hourly(axis, n) {
  var span = hours(n);
  return get(DDOC + 'hourly', {start_key: [axis, span[0]], end_key: [axis, span[n - 1], {}],
    group_level: 3}).then(function (res) {
    var by = {};
    res.rows.forEach(function (r) {
      by[r.key[1]] = by[r.key[1]] || {};
      by[r.key[1]][r.key[2]] = {files: r.value.count, bytes: r.value.sum};
    });
    return {span: span, by: by};
  });
}

function svgChart(span, by, ends, unit) {
  // Stacked bars, one per hour: plain SVG, no library.
  var NS = 'http://www.w3.org/2000/svg', width = 720, height = 160, pad = 20;
  var value = function (h, e) { return ((by[h] || {})[e] || {})[unit] || 0; };
  var totals = span.map(function (h) {
    return ends.reduce(function (n, e) { return n + value(h, e); }, 0);
  });
  var top = Math.max.apply(null, totals.concat([1]));
  var svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('width', width); svg.setAttribute('height', height + pad);
  svg.setAttribute('id', 'hourly-chart');
  var w = width / span.length;
  span.forEach(function (h, i) {
    var y = height;
    ends.forEach(function (e) {
      var v = value(h, e);
      if (!v) { return; }
      var bar = document.createElementNS(NS, 'rect');
      var hgt = v / top * (height - pad);
      y -= hgt;
      bar.setAttribute('x', i * w + 1); bar.setAttribute('width', Math.max(w - 2, 1));
      bar.setAttribute('y', y); bar.setAttribute('height', hgt);
      bar.setAttribute('fill', COLOURS[e] || '#999');
      var title = document.createElementNS(NS, 'title');
      title.textContent = h + ':00 UTC ' + e + ' ' + v;
      bar.appendChild(title);
      svg.appendChild(bar);
    });
  });
  var label = document.createElementNS(NS, 'text');
  label.setAttribute('x', 0); label.setAttribute('y', height + pad - 4);
  label.textContent = span[0] + ':00 … ' + span[span.length - 1] + ':00 UTC, top ' + top +
    (unit === 'bytes' ? ' bytes' : ' files') + ' per hour';
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
  return el('p', {}, ['window ', pick('window', Object.keys(WINDOWS)), ' in ',
    pick('unit', ['files', 'bytes'])]);
}

function endedPerHour() {
  var ends = ['done', 'failed_attempt', 'failed', 'killed'];
  return hourly('state', WINDOWS[view.window]).then(function (got) {
    var rows = got.span.filter(function (h) { return got.by[h]; }).map(function (h) {
      var cellsOf = ends.map(function (e) {
        return el('td', {'class': 'n', 'data-end': e}, [((got.by[h][e] || {})[view.unit]) || 0]);
      });
      var bytes = (got.by[h].done || {}).bytes || 0;
      return el('tr', {'data-hour': h}, [el('td', {}, [h + ':00'])].concat(cellsOf,
        [el('td', {'class': 'n', 'data-end': 'throughput'}, [(bytes / 3600).toFixed(1)])]));
    });
    return [el('h2', {}, ['Ended per hour (' + view.unit + ')']), choices(),
      svgChart(got.span, got.by, ends, view.unit),
      table('hourly', ['hour (UTC)'].concat(ends, ['throughput (bytes/s)']), rows)];
  });
}

function overview() {
  // Files per state now: one grouped read of by_state (lazy: monitoring may lag a little).
  return get(DDOC + 'by_state', {group_level: 1}).then(function (res) {
    var total = 0;
    var rows = res.rows.map(function (r) {
      total += r.value;
      return el('tr', {'data-state': r.key[0]}, [el('td', {}, [r.key[0]]),
        el('td', {'class': 'n'}, [r.value])]);
    });
    rows.push(el('tr', {'data-state': 'total'}, [el('th', {}, ['total']),
      el('td', {'class': 'n'}, [total])]));
    return [el('h2', {}, ['Files per state']), table('states', ['state', 'files'], rows)];
  }).then(function (nodes) {
    // Files per task: task_states grouped by [task, axis]; each axis counts every file once.
    return get(DDOC + 'task_states', {group_level: 2}).then(function (res) {
      var rows = res.rows.filter(function (r) { return r.key[1] === 'state'; }).map(function (r) {
        return el('tr', {'data-task': r.key[0]}, [
          el('td', {}, [el('a', {href: '#task/' + encodeURIComponent(r.key[0])}, [r.key[0]])]),
          el('td', {'class': 'n'}, [r.value])]);
      });
      return nodes.concat([el('h2', {}, ['Tasks']), table('tasks', ['task', 'files'], rows)]);
    });
  }).then(function (nodes) {
    return endedPerHour().then(function (more) { return nodes.concat(more); });
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

var ACTIVE = ['acquired', 'submitted', 'kill_requested'];
var FAILED = ['failed', 'failed_attempt'];

function sumOf(states, names) {
  return names.reduce(function (n, s) { return n + (states[s] || 0); }, 0);
}

function linkStates() {
  // {"SRC>DST": {source, destination, states: {state: files}}} from one grouped read.
  return get(DDOC + 'links', {group_level: 4}).then(function (res) {
    var links = {};
    res.rows.forEach(function (r) {
      if (r.key[2] !== 'state') { return; }
      var name = r.key[0] + '>' + r.key[1];
      links[name] = links[name] || {source: r.key[0], destination: r.key[1], states: {}};
      links[name].states[r.key[3]] = r.value;
    });
    return links;
  });
}

function linkErrors() {
  // Failed attempts per link and error class, of the requests in the database.
  return get(DDOC + 'link_errors', {group_level: 3}).then(function (res) {
    var errors = {};
    res.rows.forEach(function (r) {
      var name = r.key[0] + '>' + r.key[1];
      errors[name] = errors[name] || {};
      errors[name][r.key[2]] = r.value;
    });
    return errors;
  });
}

function links() {
  return Promise.all([linkStates(), linkErrors()]).then(function (got) {
    var all = got[0], errors = got[1];
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
            [s.done || 0, ' / ', sumOf(s, FAILED), ' / ', sumOf(s, ACTIVE)])]);
      })));
    });
    var ranked = names.map(function (n) {
      var s = all[n].states, done = s.done || 0, failed = sumOf(s, FAILED);
      return {name: n, done: done, failed: failed,
        ratio: done + failed ? failed / (done + failed) : 0};
    }).sort(function (a, b) { return b.ratio - a.ratio || a.name.localeCompare(b.name); });
    var worst = ranked.map(function (l) {
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
      el('h2', {}, ['Worst links first']),
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
  return get(DDOC + 'user_states', {group_level: 2}).then(function (res) {
    var byUser = {}, states = [];
    res.rows.forEach(function (r) {
      byUser[r.key[0]] = byUser[r.key[0]] || {};
      byUser[r.key[0]][r.key[1]] = r.value;
      if (states.indexOf(r.key[1]) < 0) { states.push(r.key[1]); }
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
  var ends = ['published', 'publication_error', 'publication_failed'];
  var perTask = get(DDOC + 'task_states', {group_level: 3}).then(function (res) {
    var tasks = {}, states = [];
    res.rows.forEach(function (r) {
      if (r.key[1] !== 'publication') { return; }
      tasks[r.key[0]] = tasks[r.key[0]] || {};
      tasks[r.key[0]][r.key[2]] = r.value;
      if (states.indexOf(r.key[2]) < 0) { states.push(r.key[2]); }
    });
    states.sort();
    var rows = Object.keys(tasks).sort().map(function (t) {
      return el('tr', {'data-task': t}, [el('td', {}, [el('a', {href: '#task/' +
        encodeURIComponent(t)}, [t])])].concat(states.map(function (s) {
        return el('td', {'class': 'n', 'data-state': s}, [tasks[t][s] || 0]);
      })));
    });
    return [el('h2', {}, ['Publication per task']),
      table('publication-tasks', ['task'].concat(states), rows)];
  });
  var perHour = hourly('publication', WINDOWS[view.window]).then(function (got) {
    var rows = got.span.filter(function (h) { return got.by[h]; }).map(function (h) {
      return el('tr', {'data-hour': h}, [el('td', {}, [h + ':00'])].concat(ends.map(function (e) {
        return el('td', {'class': 'n', 'data-end': e}, [((got.by[h][e] || {}).files) || 0]);
      })));
    });
    return [el('h2', {}, ['Publication outcomes per hour (' + view.window + ')']),
      svgChart(got.span, got.by, ends, 'files'),
      table('publication-hourly', ['hour (UTC)'].concat(ends), rows)];
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
  return Promise.all([perTask, perHour, failed]).then(function (parts) {
    return parts[0].concat(parts[1], parts[2]);
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

function file(id) {
  return get('/' + DB + '/' + encodeURIComponent(id)).then(function (doc) {
    var rows = (doc.history || []).map(function (h) {
      return el('tr', {}, [el('td', {}, [when(h.at)]), el('td', {}, [h.axis]),
        el('td', {}, [h.from === null ? '' : h.from]), el('td', {}, [h.to]),
        el('td', {}, [h.by]), el('td', {}, [h.reason || ''])]);
    });
    return [el('h2', {}, [doc.source_lfn]),
      el('p', {}, ['task ', el('a', {href: '#task/' + doc.task}, [doc.task]), ', job ' + doc.job_id,
        ', ' + doc.source + ' → ' + doc.destination]),
      table('history', ['time (UTC)', 'axis', 'from', 'to', 'by', 'reason'], rows)];
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
  render(arg).then(function (nodes) {
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
