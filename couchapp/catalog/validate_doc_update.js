function (newDoc, oldDoc, userCtx, secObj) {
  var roles = userCtx.roles || [];
  function has(role) { return roles.indexOf(role) !== -1; }
  function refuse(rule, why) { throw({forbidden: '[' + rule + '] ' + why}); }
  var admin = has('_admin') || has('aso-admin');
  // EMBEDDED_VALIDATES_BEFORE_CONFLICT: a write based on another revision than
  // the current one is a conflict, refused here as one (the embedded store asks before it looks).
  var live = oldDoc && !oldDoc._deleted, rev = newDoc._rev;
  var current = oldDoc ? rev === oldDoc._rev || (!live && rev === undefined) : rev === undefined;
  if (!admin && !current) {
    refuse('conflict', 'the write is based on another revision than the current one');
  }
  if (!admin && !has('aso-agent')) {
    refuse('catalog', 'only agents and admins write the catalog');
  }
  if (newDoc._deleted) {
    if (admin || (oldDoc && oldDoc.type === 'block')) { return; }
    refuse('catalog', 'agents delete blocks only');
  }
  if (oldDoc && !admin) { refuse('immutable', 'catalog documents do not change once written'); }
  if (newDoc._id.indexOf('_design/') === 0) {
    if (!admin) { refuse('design', 'only admins may change design documents'); }
    return;
  }
  function str(v) { return typeof v === 'string' && v.length > 0 && v.length <= 1024; }
  function num(v) { return typeof v === 'number' && v >= 0 && Math.floor(v) === v; }
  if (newDoc.type === 'dataset') {
    if (!str(newDoc.dataset) || newDoc._id !== 'dataset:' + newDoc.dataset) {
      refuse('schema', 'a dataset document is dataset:<name> with its name in dataset');
    }
    return;
  }
  if (newDoc.type !== 'block') { refuse('schema', 'type must be block or dataset'); }
  if (!str(newDoc.dataset) || newDoc._id.indexOf(newDoc.dataset + '#') !== 0) {
    refuse('schema', 'a block is named <dataset>#<id>');
  }
  if (!str(newDoc.origin_site) || !str(newDoc.user)) {
    refuse('schema', 'a block needs origin_site and user');
  }
  if (!Array.isArray(newDoc.files) || newDoc.files.length === 0) {
    refuse('schema', 'a block needs files');
  }
  var seen = {};
  for (var i = 0; i < newDoc.files.length; i++) {
    var f = newDoc.files[i];
    if (!f || !str(f.lfn) || f.lfn.indexOf('/store/') !== 0) {
      refuse('schema', 'files[' + i + '].lfn must be an LFN under /store/');
    }
    if (seen[f.lfn]) { refuse('schema', 'file ' + f.lfn + ' twice in the block'); }
    seen[f.lfn] = true;
    if (!num(f.size) || !str(f.adler32) || !num(f.events)) {
      refuse('schema', 'files[' + i + '] needs size, adler32 and events');
    }
    if (typeof f.lumis !== 'object' || !Array.isArray(f.parents)) {
      refuse('schema', 'files[' + i + '] needs lumis (object) and parents (list)');
    }
  }
}
