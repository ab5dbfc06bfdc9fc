// Loaded into pouchdb-server with `node --require` (aso/local/embedded.py, server_env): the
// embedded store's request guard. pouchdb-server 4.2.0 (express-pouchdb, pinned by
// deploy/store/package-lock.json) dies on some malformed requests (an unhandled rejection or
// error event ends the one process that serves everyone), runs code a request sends, lets a
// member make themselves an admin, and keeps a closed feed's listener for ever. Its port is on
// loopback, but anything on the host reaches it, and so does any bug of the front end. What it
// gets wrong is refused here before a route handles it, with CouchDB's answer shape
// {"error", "reason"}, whoever sends it. docs/store-quirks.md names each case (EMBEDDED_*);
// tests/test_embedded_guard.py sends each killing request straight to the store's port.
//
// Four hooks, each on a module of express-pouchdb or pouchdb as node loads it (no file is
// changed on disk):
// * routes/root.js: the guard's middleware goes in front of the first route, after
//   authentication (so it knows a server admin) and after the vhost and rewrite middlewares
//   (so it sees the path the routes will see). It judges the path, the query, the identity.
// * utils.js: the JSON body parser every route with a JSON body uses; the body is judged as it
//   is parsed, for the route that parsed it (no second read of the stream).
// * routes/changes.js: a feed whose client has gone is cancelled and its heartbeat stopped.
// * pouchdb-utils: live changes listeners are counted (the stat clients_requesting_changes).
// If express-pouchdb is not the one these hooks are written for, the server refuses to listen.
'use strict';
const http = require('http');
const Module = require('module');

// EMBEDDED_UNBOUNDED_BATCHES: the most keys, doc_ids or documents in one request of a store
// user, the front end's own bound (docs/openapi.yaml, maxItems 1000): 100,000 view keys held
// the one process for 14-17 s. Server admins and the agent role (ASO's own code, whose batches
// follow its configuration) are not bounded here.
const MAX_BATCH = 1000;
// EMBEDDED_HEARTBEAT_BUSY: a live feed writes a newline every `heartbeat` ms: twenty 1 ms
// feeds took a fifth of a core.
// Clients send seconds (CouchDB's and PouchDB's examples: 10000); 100 ms is ten writes a second.
const MIN_HEARTBEAT_MS = 100;
const AGENT_ROLE = process.env.ASO_AGENT_ROLE || '';

// CouchDB's rule for database names, and the system databases CouchDB and pouchdb-server know.
const DATABASE_NAME = /^[a-z][a-z0-9_$()+/-]*$/;
const SYSTEM_DATABASES = new Set(['_users', '_replicator', '_global_changes']);
// The server-level endpoints pouchdb-server serves (first path segments that are no database).
const SERVER_ENDPOINTS = new Set([
  '_active_tasks', '_all_dbs', '_cluster_setup', '_config', '_db_updates', '_log', '_membership',
  '_node', '_replicate', '_restart', '_session', '_stats', '_up', '_utils', '_uuids',
]);
// Database-level endpoints of each method: anything else after a database name is a document.
const DATABASE_ENDPOINTS = {
  POST: new Set(['_all_docs', '_bulk_docs', '_bulk_get', '_changes', '_compact', '_explain',
    '_find', '_index', '_revs_diff', '_temp_view', '_view_cleanup', '_ensure_full_commit']),
  PUT: new Set(['_security']),
  DELETE: new Set(['_index']),
};
const FEEDS = new Set(['normal', 'longpoll', 'continuous', 'eventsource']);
const GUARD = Symbol('aso-request-guard');
const STATS_PATH = '/_stats/couchdb/httpd/clients_requesting_changes';

// --- answers ------------------------------------------------------------------------------
function refusal(status, error, reason) {
  return {status, error, reason};
}

const badRequest = (reason) => refusal(400, 'bad_request', reason);
const forbidden = (reason) => refusal(403, 'forbidden', reason);

function send(req, res, answer) {
  req.resume(); // the body, if any, is not read: drain it so the connection can be reused
  res.statusCode = answer.status;
  res.setHeader('Content-Type', 'application/json');
  res.end(JSON.stringify({error: answer.error, reason: answer.reason}) + '\n');
}

// --- what a request is ----------------------------------------------------------------------
// `segments`: the path's segments as the routes match them (split, then each decoded);
// `docId`: what follows the database name, decoded whole, as the document routes read their id.
function describe(req) {
  const path = req.url.split('?')[0];
  const raw = path.split('/').slice(1);
  if (raw.length > 1 && raw[raw.length - 1] === '') {
    raw.pop(); // a trailing slash: the routes match without it
  }
  const userCtx = (req.couchSession && req.couchSession.userCtx) || {};
  const roles = Array.isArray(userCtx.roles) ? userCtx.roles : [];
  const request = {
    method: req.method,
    segments: null,
    docId: '',
    query: req.query || {},
    // Read now: a later middleware of express-pouchdb adds _admin to a user who reads their
    // own _users document, for that request.
    serverAdmin: roles.includes('_admin'),
    bounded: !roles.includes('_admin') && !(AGENT_ROLE && roles.includes(AGENT_ROLE)),
    destination: req.headers.destination,
    multipart: /^multipart\//i.test(req.headers['content-type'] || ''),
    contentType: (req.headers['content-type'] || '').split(';')[0].trim().toLowerCase(),
    host: req.headers.host || '',
    origin: req.headers.origin,
    referer: req.headers.referer,
    fetchSite: req.headers['sec-fetch-site'],
  };
  try {
    request.segments = raw.map(decodeURIComponent);
    request.docId = raw.length > 1 ? decodeURIComponent(raw.slice(1).join('/')) : '';
  } catch (err) {
    request.segments = null; // not valid percent-encoded UTF-8
  }
  return request;
}

const database = (request) => request.segments[0];
const within = (request) => request.segments.slice(1); // the path after the database name

function isList(value, each) {
  return Array.isArray(value) && value.every(each);
}

const isString = (value) => typeof value === 'string';
const isObject = (value) => value !== null && typeof value === 'object' && !Array.isArray(value);
const isCount = (value) => Number.isInteger(value) && value >= 0;

function batchRefusal(request, what, items) {
  if (request.bounded && items.length > MAX_BATCH) {
    return badRequest(`at most ${MAX_BATCH} ${what} in one request here (${items.length} sent)`);
  }
  return null;
}

// --- the path and the identity ----------------------------------------------------------------
// EMBEDDED_NAMES_UNCHECKED: the store strips NUL and `"` from a database name (/%00_replicator
// is _replicator) and serves names CouchDB refuses.
function databaseNameRule(request) {
  if (request.segments === null) {
    return badRequest('the path is not valid percent-encoded UTF-8');
  }
  const name = database(request);
  if (name === undefined || name === '') {
    return null;
  }
  if (name.startsWith('_')) {
    if (SYSTEM_DATABASES.has(name) || SERVER_ENDPOINTS.has(name)) {
      return null;
    }
  } else if (DATABASE_NAME.test(name)) {
    return null;
  }
  return refusal(400, 'illegal_database_name', `Name: ${JSON.stringify(name)}. Only lowercase ` +
    'characters (a-z), digits (0-9), and any of the characters _, $, (, ), +, -, and / are ' +
    'allowed. Must begin with a letter.');
}

// EMBEDDED_REPLICATE_ANYONE: POST /_replicate needs no account there: anyone copied any
// database (_users with its password hashes) to any address, or into any database, past its
// validation. EMBEDDED_CRASH_ON_NON_ADMIN_DB_CREATE, EMBEDDED_CRASH_ON_NON_ADMIN_MAINTENANCE:
// a non-admin's PUT /db, DELETE /db, _compact or _view_cleanup is an unhandled 401 that kills
// the server.
function serverAdminRule(request) {
  if (request.serverAdmin) {
    return null;
  }
  const rest = within(request);
  const maintenance = request.method === 'POST' && rest.length === 1 &&
    ['_compact', '_view_cleanup'].includes(rest[0]);
  const wholeDatabase = ['PUT', 'DELETE'].includes(request.method) && rest.length === 0 &&
    !!database(request) && !database(request).startsWith('_');
  if (database(request) === '_replicate' || maintenance || wholeDatabase) {
    return refusal(401, 'unauthorized', 'You are not a server admin.');
  }
  return null;
}

// EMBEDDED_USERS_SELF_ADMIN: a user who writes their own _users document is made _admin for
// that request, and gives themselves any role; _replicator runs what is written there. Only
// the server admin writes to a system database (`aso db init` keeps their reads to it too).
function systemDatabaseRule(request) {
  const reading = request.method === 'GET' || request.method === 'HEAD';
  if (SYSTEM_DATABASES.has(database(request)) && !reading && !request.serverAdmin) {
    return forbidden(`only the server admin writes to ${database(request)}`);
  }
  return null;
}

// The id of the document a request writes by its path (null: it writes none by its path).
function writtenByPath(request) {
  const rest = within(request);
  const endpoints = DATABASE_ENDPOINTS[request.method];
  if (request.method === 'COPY') {
    return String(request.destination || '').split('?')[0];
  }
  if (!['PUT', 'POST', 'DELETE'].includes(request.method) || rest.length === 0) {
    return null;
  }
  if (endpoints.has(rest[0])) {
    return null;
  }
  if (request.method === 'POST' && rest[0] === '_design' && rest.length > 2 &&
      rest[2].startsWith('_')) {
    return null; // a view, show, list or update function: no write of the design document
  }
  return request.docId;
}

// EMBEDDED_LOCAL_UNVALIDATED: validate_doc_update never runs for an id starting with _local
// (_localx too) and the store keeps a database's _security in _local/_security: a member who
// wrote it was the database's admin. EMBEDDED_DESIGN_FUNCTIONS_UNSANDBOXED: a design
// document's validate_doc_update, shows and updates run with a plain eval in the server's own
// process (couchdb-eval): whoever writes one runs code as the store's user. Only the server
// admin writes documents whose id starts with `_` (ASO's design documents, `aso db init`);
// nothing of ASO writes _local documents.
function reservedIdRefusal(request, id) {
  if (!request.serverAdmin && isString(id) && id.startsWith('_')) {
    return forbidden(`only the server admin writes documents whose id starts with _ here ` +
      `(${JSON.stringify(id.slice(0, 40))})`);
  }
  return null;
}

function reservedWriteRule(request) {
  if (database(request) === undefined || database(request).startsWith('_')) {
    return null;
  }
  const id = writtenByPath(request);
  if (id === null) {
    return null;
  }
  if (request.multipart && request.method === 'PUT' && !request.serverAdmin) {
    // The multipart PUT takes the document, its _id included, from the body's JSON part.
    return forbidden('only the server admin writes documents as multipart/related here');
  }
  return reservedIdRefusal(request, id);
}

// EMBEDDED_DESIGN_FUNCTIONS_UNSANDBOXED: the index endpoint writes design documents
// (_design/idx-..., or a name the caller chooses).
function indexRule(request) {
  const rest = within(request);
  const writes = request.method === 'POST' || request.method === 'DELETE';
  if (rest[0] === '_index' && writes && !request.serverAdmin) {
    return forbidden('only the server admin creates or deletes indexes here');
  }
  return null;
}

// EMBEDDED_TEMP_VIEW_RUNS_CODE: POST /db/_temp_view evaluates the body's map function in a
// context it escapes, before it checks who sent it: anyone ran code in the store. CouchDB 3
// has no temporary views (410). EMBEDDED_LIST_CRASH: a _list of a missing list function kills
// the server; ASO has no list functions.
function designFunctionRule(request) {
  const rest = within(request);
  if (rest[0] === '_temp_view') {
    return refusal(410, 'gone', 'Temporary views are not supported in CouchDB');
  }
  if (rest[0] === '_design' && rest[2] === '_list') {
    return forbidden('list functions are not served by the embedded store');
  }
  return null;
}

// --- the query ------------------------------------------------------------------------------
// express-pouchdb has parsed each query value as JSON where it could.

// EMBEDDED_LATEST_CRASH: `latest` with a revision the document does not have (rev, open_revs,
// _bulk_get) throws outside any handler and kills the server. ASO sends it only as
// `open_revs=all&latest=true` (aso/store/couchapi.py Database.leaves: every live leaf), which names no
// revision: that alone is served.
function latestRule(request) {
  const query = request.query;
  if (!('latest' in query) || query.latest === false) {
    return null;
  }
  if (query.open_revs === 'all' && !('rev' in query) && request.method === 'GET') {
    return null;
  }
  return badRequest('`latest` is served by the embedded store only with open_revs=all');
}

// EMBEDDED_VIEW_KEYS_UNCHECKED: `keys` that is no list (a 500), `open_revs` that is neither
// "all" nor a list (a 500).
function queryTypesRule(request) {
  const query = request.query;
  if ('open_revs' in query && query.open_revs !== 'all' && !isList(query.open_revs, isString)) {
    return badRequest('`open_revs` must be "all" or a JSON array of revisions');
  }
  if ('keys' in query) {
    if (!Array.isArray(query.keys)) {
      return badRequest('`keys` must be a JSON array');
    }
    return batchRefusal(request, 'keys', query.keys);
  }
  return null;
}

// EMBEDDED_CHANGES_FILTER_CRASH and EMBEDDED_CHANGES_DOC_IDS_CRASH: a filter other than
// _doc_ids, a `view` or `selector` (which make one), _doc_ids without its ids, or doc_ids that
// are no list kill the server; EMBEDDED_HEARTBEAT_BUSY: a tiny heartbeat keeps a core busy.
function changesRule(request) {
  if (within(request)[0] !== '_changes' || within(request).length !== 1) {
    return null;
  }
  const query = request.query;
  if ('filter' in query && query.filter !== '_doc_ids') {
    return badRequest('the only filter of the embedded store\'s feed is _doc_ids');
  }
  for (const name of ['view', 'selector']) {
    if (name in query) {
      return badRequest(`\`${name}\` is not served by the embedded store's feed`);
    }
  }
  if ('feed' in query && !FEEDS.has(query.feed)) {
    return badRequest('`feed` is normal, longpoll, continuous or eventsource');
  }
  if ('heartbeat' in query && query.heartbeat !== true &&
      !(Number.isInteger(query.heartbeat) && query.heartbeat >= MIN_HEARTBEAT_MS)) {
    return badRequest(`\`heartbeat\` is true or at least ${MIN_HEARTBEAT_MS} ms here`);
  }
  for (const name of ['limit', 'timeout']) {
    if (name in query && !isCount(query[name])) {
      return badRequest(`\`${name}\` must be a non-negative integer`);
    }
  }
  if ('doc_ids' in query) {
    return docIdsRefusal(request, query.doc_ids);
  }
  if (query.filter === '_doc_ids' && request.method !== 'POST') {
    return badRequest('filter=_doc_ids needs doc_ids');
  }
  return null;
}

function docIdsRefusal(request, docIds) {
  if (!isList(docIds, isString)) {
    return badRequest('`doc_ids` must be a JSON array of document ids');
  }
  return batchRefusal(request, 'doc_ids', docIds);
}

// EMBEDDED_LOG_CRASH: a `bytes` or `offset` of /_log that is no number kills the server.
function logRule(request) {
  if (database(request) !== '_log') {
    return null;
  }
  for (const name of ['bytes', 'offset']) {
    if (name in request.query && !isCount(request.query[name])) {
      return badRequest(`\`${name}\` must be a non-negative integer`);
    }
  }
  return null;
}

// EMBEDDED_NO_CSRF_CHECK: pouchdb-server took a form post from any page (`multipart/form-data`
// to a design document: an attachment upload), with the session cookie of whoever had the
// monitoring pages open, and answered any origin's CORS preflight with credentials allowed:
// another site's page wrote the pages' design document with an operator's admin session.
// CouchDB refuses a form post without a Referer of its own host. Here a write (any method but
// GET and HEAD) from another site (Sec-Fetch-Site, Origin), or in a type a page may post
// without asking (a form, text/plain) without an Origin or Referer of this host, is refused.
const SIMPLE_TYPES = new Set(['multipart/form-data', 'application/x-www-form-urlencoded',
  'text/plain']);

function hostOf(url) {
  try {
    return new URL(url).host;
  } catch (err) {
    return null;
  }
}

function crossSiteRule(request) {
  if (request.method === 'GET' || request.method === 'HEAD') {
    return null;
  }
  if (request.fetchSite === 'cross-site' || request.fetchSite === 'same-site') {
    return forbidden('a write from another site\'s page is refused (Sec-Fetch-Site)');
  }
  if (request.origin !== undefined && hostOf(request.origin) !== request.host) {
    return forbidden('a write from another origin is refused (Origin ' +
      JSON.stringify(String(request.origin).slice(0, 100)) + ')');
  }
  const from = request.origin !== undefined ? request.origin : request.referer;
  if (SIMPLE_TYPES.has(request.contentType) && (from === undefined || hostOf(from) !== request.host)) {
    return forbidden('Referer header required: a ' + request.contentType + ' write must come ' +
      'from this host\'s own page');
  }
  return null;
}

const REQUEST_RULES = [
  crossSiteRule, databaseNameRule, serverAdminRule, systemDatabaseRule, reservedWriteRule, indexRule,
  designFunctionRule, latestRule, queryTypesRule, changesRule, logRule,
];

// --- bodies, as the route's JSON parser reads them ------------------------------------------
function bodyRoute(request) {
  const rest = within(request);
  if (rest.length === 0) {
    return request.method === 'POST' ? 'create' : null;
  }
  if (rest[0] === '_design' && rest[2] === '_view') {
    return 'view';
  }
  if (rest.length === 1 && rest[0] === '_security') {
    return request.method === 'PUT' ? '_security' : null;
  }
  if (rest.length === 1 && DATABASE_ENDPOINTS.POST.has(rest[0])) {
    return request.method === 'POST' ? rest[0] : null;
  }
  return request.method === 'PUT' ? 'update' : null;
}

// EMBEDDED_500_ON_MALFORMED_DOCS: `_attachments` that is no object of objects, or
// `_revisions` that is no {start, ids}, is a 500 there (or is dropped without a word).
function shapeRefusal(doc) {
  const attachments = doc._attachments;
  if (attachments !== undefined &&
      !(isObject(attachments) && Object.values(attachments).every(isObject))) {
    return badRequest('`_attachments` must be an object of attachment objects');
  }
  const revisions = doc._revisions;
  if (revisions !== undefined && !(isObject(revisions) && Number.isInteger(revisions.start) &&
      isList(revisions.ids, isString))) {
    return badRequest('`_revisions` must be {"start": integer, "ids": [revision ids]}');
  }
  return null;
}

function createBody(request, body) {
  return reservedIdRefusal(request, body._id) || shapeRefusal(body);
}

function updateBody(request, body) {
  // The document route takes the body's _id, then ?id=, before the path's.
  return reservedIdRefusal(request, body._id || request.query.id) || shapeRefusal(body);
}

// EMBEDDED_500_ON_MALFORMED_DOCS: `docs` that is no list of objects is a 500 there.
function bulkDocsBody(request, body) {
  if (!isList(body.docs, isObject)) {
    return badRequest('`docs` must be a JSON array of documents');
  }
  const tooMany = batchRefusal(request, 'documents', body.docs);
  if (tooMany) {
    return tooMany;
  }
  for (const doc of body.docs) {
    const refused = reservedIdRefusal(request, doc._id) || shapeRefusal(doc);
    if (refused) {
      return refused;
    }
  }
  return null;
}

function bulkGetBody(request, body) {
  const wanted = (doc) => isObject(doc) && isString(doc.id) && (!('rev' in doc) || isString(doc.rev));
  if ('latest' in body && body.latest !== false) {
    return badRequest('`latest` is not served by the embedded store');
  }
  if (!isList(body.docs, wanted)) {
    return badRequest('`docs` must be a JSON array of {"id", "rev"} objects');
  }
  return batchRefusal(request, 'documents', body.docs);
}

// EMBEDDED_VIEW_KEYS_UNCHECKED: `keys` that is no list is a 500, and each key is one more pass.
function keysBody(request, body) {
  if (!('keys' in body)) {
    return null;
  }
  if (!Array.isArray(body.keys)) {
    return badRequest('`keys` must be a JSON array');
  }
  return batchRefusal(request, 'keys', body.keys);
}

function changesBody(request, body) {
  if ('doc_ids' in body) {
    return docIdsRefusal(request, body.doc_ids);
  }
  if (request.query.filter === '_doc_ids' && !('doc_ids' in request.query)) {
    return badRequest('filter=_doc_ids needs doc_ids');
  }
  return null;
}

// EMBEDDED_REVS_DIFF_CRASH: a _revs_diff entry that is no list of revisions kills the server.
function revsDiffBody(request, body) {
  const entries = Object.values(body);
  if (!entries.every((revs) => isList(revs, isString))) {
    return badRequest('each value of a _revs_diff body must be a JSON array of revisions');
  }
  return batchRefusal(request, 'documents', entries);
}

// EMBEDDED_SECURITY_UNCHECKED: a _security of another shape is stored, and breaks every later
// request to the database (or opens it).
function securityBody(request, body) {
  const section = (value) => value === undefined || (isObject(value) &&
    ['names', 'roles'].every((key) => value[key] === undefined || isList(value[key], isString)));
  if (!section(body.admins) || !section(body.members)) {
    return badRequest('`admins` and `members` must be objects of `names` and `roles` lists');
  }
  return null;
}

const BODY_RULES = {
  create: createBody,
  update: updateBody,
  view: keysBody,
  _all_docs: keysBody,
  _bulk_docs: bulkDocsBody,
  _bulk_get: bulkGetBody,
  _changes: changesBody,
  _revs_diff: revsDiffBody,
  _security: securityBody,
};

function bodyRefusal(req) {
  const request = req[GUARD];
  if (!request || !request.segments || database(request) === undefined) {
    return null;
  }
  const rule = BODY_RULES[bodyRoute(request)];
  if (!rule) {
    return null;
  }
  // A body that is no JSON object (or was not JSON) reaches the route as it was before.
  const body = req.body;
  return isObject(body) ? rule(request, body) : rule(request, {});
}

function checkingBodies(jsonParser) {
  return function (req, res, next) {
    jsonParser(req, res, function (err) {
      const refused = err ? null : bodyRefusal(req);
      if (refused) {
        return send(req, res, refused);
      }
      next(err);
    });
  };
}

// --- the guard ---------------------------------------------------------------------------------
function guardRequests(req, res, next) {
  const request = describe(req);
  req[GUARD] = request;
  if (request.segments && isStatsRequest(req)) {
    return sendStats(request, res);
  }
  for (const rule of REQUEST_RULES) {
    const refused = rule(request);
    if (refused) {
      return send(req, res, refused);
    }
  }
  next();
}

// --- feeds -------------------------------------------------------------------------------------
// EMBEDDED_FEEDS_NEVER_RELEASED: the changes route keeps a continuous feed's listener and its
// heartbeat timer after the client has gone (100 closed feeds: a write's median 9 → 43 ms;
// 20 with heartbeat=1: idle CPU 1 → 23 %). When the response closes (the client left, or it
// ended), the feeds the handler opened are cancelled and the timers it started are cleared.
// The route keeps its heartbeat timer in a local variable and clears it only on an error: the
// timers are the ones it starts while it runs (synchronously, before it returns).
function releasingFeeds(handler) {
  return function (req, res) {
    const feeds = [];
    const timers = [];
    const db = req.db;
    req.db = Object.create(db, {
      // Only live feeds are cancelled: a one-off read (a long poll's first look) cancelled
      // resolves with no `results`, which the route reads, and the store dies (the red team:
      // EMBEDDED_LONGPOLL_CANCELLED_READ).
      changes: {value: (opts) => {
        const live = Boolean(opts && (opts.live || opts.continuous));
        const feed = db.changes(opts);
        if (live) { feeds.push(feed); }
        return feed;
      }},
    });
    res.once('close', () => {
      timers.forEach(clearInterval);
      feeds.forEach((feed) => feed.cancel());
    });
    const setIntervalOfNode = global.setInterval;
    global.setInterval = function (...args) {
      const timer = setIntervalOfNode.apply(this, args);
      timers.push(timer);
      return timer;
    };
    try {
      return handler(req, res);
    } finally {
      global.setInterval = setIntervalOfNode;
    }
  };
}

function wrapChangesRoutes(register) {
  return function (app) {
    const routes = Object.create(app);
    routes.get = (path, ...handlers) => app.get(path, ...withReleasedFeeds(handlers));
    routes.post = (path, ...handlers) => app.post(path, ...withReleasedFeeds(handlers));
    return register(routes);
  };
}

function withReleasedFeeds(handlers) {
  const last = handlers.length - 1;
  return handlers.map((handler, i) => (i === last ? releasingFeeds(handler) : handler));
}

// Live changes listeners of every database (pouchdb-utils' changes handler keeps them by id).
const changesHandlers = new Set();

function countingListeners(utils) {
  const prototype = utils.changesHandler.prototype;
  const addListener = prototype.addListener;
  prototype.addListener = function (...args) {
    changesHandlers.add(this);
    return addListener.apply(this, args);
  };
  return utils;
}

function openListeners() {
  let count = 0;
  changesHandlers.forEach((handler) => { count += Object.keys(handler._listeners).length; });
  return count;
}

// CouchDB's stat of the clients of live feeds (GET /_node/_local/_stats/couchdb/httpd/
// clients_requesting_changes, server admins): here, the live changes listeners.
function isStatsRequest(req) {
  const path = req.url.split('?')[0].replace(/^\/_node\/_local(?=\/)/, '');
  return path === STATS_PATH;
}

function sendStats(request, res) {
  if (!request.serverAdmin) {
    return send(res.req, res, refusal(401, 'unauthorized', 'You are not a server admin.'));
  }
  res.statusCode = 200;
  res.setHeader('Content-Type', 'application/json');
  res.end(JSON.stringify({value: openListeners(), type: 'counter',
    desc: 'number of clients for continuous _changes (embedded store: live changes listeners)'}) +
    '\n');
}

// EMBEDDED_SESSION_COOKIE_CROSS_SITE: the session cookie came without SameSite (a browser sent
// it with other sites' requests) and readable by scripts; CouchDB's is SameSite=Strict with
// ASO's settings (aso/local/couchdb.py [chttpd_auth] same_site).
const writeHead = http.ServerResponse.prototype.writeHead;
http.ServerResponse.prototype.writeHead = function (...args) {
  const cookies = this.getHeader('set-cookie');
  if (cookies !== undefined) {
    this.setHeader('Set-Cookie', [].concat(cookies).map((cookie) => (
      /;\s*samesite=/i.test(cookie) ? cookie : cookie + '; SameSite=Strict; HttpOnly')));
  }
  for (const name of this.getHeaderNames()) {
    if (name.startsWith('access-control-')) {
      this.removeHeader(name); // EMBEDDED_CORS_OPEN: no CORS, as CouchDB's default
    }
  }
  return writeHead.apply(this, args);
};

// EMBEDDED_CORS_OPEN: pouchdb-server enables CORS for every origin with credentials by default
// (lib/cors.js): its middleware is replaced by one that does nothing.
const noCors = () => () => (req, res, next) => next();

// --- hooks ---------------------------------------------------------------------------------------
const HOOKS = [
  {target: /[\\/]pouchdb-server[\\/]lib[\\/]cors\.js$/, wrap: noCors},
  {
    target: /[\\/]express-pouchdb[\\/]lib[\\/]routes[\\/]root\.js$/,
    wrap: (register) => (app) => { app.use(guardRequests); return register(app); },
  },
  {
    target: /[\\/]express-pouchdb[\\/]lib[\\/]utils\.js$/,
    wrap: (utils) => { utils.jsonParser = checkingBodies(utils.jsonParser); return utils; },
  },
  {target: /[\\/]express-pouchdb[\\/]lib[\\/]routes[\\/]changes\.js$/, wrap: wrapChangesRoutes},
  {
    target: /[\\/]pouchdb-utils[\\/]lib[\\/]index\.js$/, // every copy: one has the listeners
    wrap: countingListeners,
  },
];
const applied = new Set();

const compile = Module.prototype._compile;
Module.prototype._compile = function (content, filename) {
  const result = compile.call(this, content, filename);
  for (const hook of HOOKS) {
    if (hook.target.test(filename)) {
      this.exports = hook.wrap(this.exports);
      applied.add(hook);
    }
  }
  return result;
};

// A server whose guard did not take would serve everything unguarded: refuse to listen.
const listen = http.Server.prototype.listen;
http.Server.prototype.listen = function (...args) {
  const missing = HOOKS.filter((hook) => !applied.has(hook));
  if (missing.length) {
    console.error('request-guard.js: not loaded: ' + missing.map((h) => h.target).join(', ') +
      ' (another express-pouchdb than deploy/store/package-lock.json pins?)');
    process.exit(70);
  }
  return listen.apply(this, args);
};

module.exports = {MAX_BATCH, MIN_HEARTBEAT_MS, openListeners};
