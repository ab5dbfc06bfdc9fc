function (newDoc, oldDoc, userCtx, secObj) {
  // The one authority on what may be written to the notify database: users' subscriptions
  // (notify:USER, by that user or an operator) and the notifier's record of the tasks it told
  // (told:USER, by the agents). The tables are aso/model.py's (notify_model), pushed by
  // `aso db init` as lib/model; lib/schema is the files database's schema checker. ES5 only.
  var model = require('lib/model');
  var schema = require('lib/schema')(model, null);
  var refuse = schema.refuse;
  var roles = userCtx.roles || [];
  function hasRole(role) { return roles.indexOf(role) !== -1; }
  if (hasRole('_admin')) { return; }
  var operator = hasRole(model.admin_roles[1]), agent = hasRole(model.agent_role);

  // EMBEDDED_VALIDATES_BEFORE_CONFLICT: a write based on another revision than the current one
  // is a conflict, refused here as one (the embedded store asks before it looks).
  var live = oldDoc && !oldDoc._deleted, rev = newDoc._rev;
  if (!(oldDoc ? rev === oldDoc._rev || (!live && rev === undefined) : rev === undefined)) {
    refuse('conflict', 'the write is based on another revision than the current one');
  }
  var id = newDoc._id, told = new RegExp(model.told_id_pattern).test(id);
  var subscription = new RegExp(model.notify_id_pattern).test(id);
  if (!told && !subscription) {
    refuse('schema', 'the notify database holds notify:USER and told:USER documents only');
  }
  var owner = id.slice(id.indexOf(':') + 1);
  if (told) {
    if (!agent && !operator) { refuse('notify', 'the notifier records what it told; users do not'); }
    if (newDoc._deleted) { return; }
    schema.checkObject('doc', newDoc, model.told_schema);
    if (newDoc.user !== owner) { refuse('schema', 'doc._id must be told:' + newDoc.user); }
    return;
  }
  if (!operator && userCtx.name !== owner) {
    refuse('notify', 'user ' + JSON.stringify(userCtx.name) + ' may not write the subscription of user ' + JSON.stringify(owner));
  }
  if (newDoc._deleted) { return; }
  if (JSON.stringify(newDoc).length > model.max_doc_chars) {
    refuse('schema', 'the document is larger than ' + model.max_doc_chars + ' characters');
  }
  schema.checkObject('doc', newDoc, model.subscription_schema);
  if (newDoc.user !== owner) { refuse('schema', 'doc._id must be notify:' + newDoc.user); }
  if (!operator && newDoc.by !== userCtx.name) {
    refuse('notify', 'a subscription is recorded by its user, ' + userCtx.name + ', not ' + JSON.stringify(newDoc.by));
  }
  var i, seen = {};
  for (i = 0; i < newDoc.targets.length; i++) {
    var target = newDoc.targets[i];
    var pattern = target.kind === 'mail' ? model.mail_pattern : model.webhook_pattern;
    if (!(new RegExp(pattern)).test(target.to)) {
      refuse('schema', 'doc.targets[' + i + '].to ' + JSON.stringify(target.to) + ' does not match ' + pattern);
    }
    var key = target.kind + ' ' + target.to;
    if (seen[key] === true) { refuse('schema', 'doc.targets[' + i + '] is given twice'); }
    seen[key] = true;
  }
  for (i = 0; i < newDoc.events.length; i++) {
    if (newDoc.events.indexOf(newDoc.events[i]) !== i) { refuse('schema', 'doc.events[' + i + '] is given twice'); }
  }
  var now = Date.now() / 1000;
  if (newDoc.updated > now + model.clock_ahead || newDoc.updated < now - model.clock_behind) {
    refuse('time', "updated must be the store's time: at most " + model.clock_ahead + ' seconds ahead of its clock and ' + model.clock_behind + ' seconds behind it');
  }
}
