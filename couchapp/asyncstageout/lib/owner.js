// What a user owns: CMS's namespaces (the temporary area, the user's and granted groups'
// areas, datasets) and CRAB's tasks, judged alike by validate_doc_update on every write and by
// ASO's Python in QuickJS (aso/provision/storejs.py: the front end's group roles, the deleter's
// temporary area, an upload judged before it is sent): one source for each rule. ES5 only.
//
// module.exports(model): the rules over lib/model's tables, given by the caller.
module.exports = function (model) {
  var ns = model.namespaces;

  function startsWith(text, prefix) {
    return text.slice(0, prefix.length) === prefix;
  }

  // The groups whose areas the roles grant (group:<group>).
  function grantedGroups(roles) {
    var out = [], i, group;
    if (!Array.isArray(roles)) { return out; }
    for (i = 0; i < roles.length; i++) {
      if (typeof roles[i] === 'string' && startsWith(roles[i], ns.group_role)) {
        group = roles[i].slice(ns.group_role.length);
        if ((new RegExp(ns.group_name_pattern)).test(group)) { out.push(group); }
      }
    }
    return out;
  }

  // A temporary area /store/temp/user/<dir>/ belongs to the part of <dir> before its first "."
  // (<name>.<hash>): a name with a "." would share it with another user, so it owns none.
  function inTempArea(name, lfn) {
    var own = ns.temp_user_area + name;
    if (name.indexOf('.') !== -1 || !startsWith(lfn, own)) { return false; }
    var rest = lfn.slice(own.length);
    return startsWith(rest, '/') || (new RegExp(ns.temp_hash_pattern)).test(rest);
  }

  // A dataset /<primary>/<owner>-<rest>/USER belongs to the part of its processed name before
  // the first "-": only that user or group, never a name that itself holds a "-".
  function datasetOwner(dataset) {
    var parts = dataset.split('/');
    var processed = parts.length > 2 ? parts[2] : '';
    var cut = processed.indexOf('-');
    return cut > 0 ? processed.slice(0, cut) : null;
  }

  // Why user `name` with `roles` may not record `doc`'s files and dataset (null: they may).
  function namespaceRefusal(doc, name, roles) {
    var i;
    if (!inTempArea(name, doc.source_lfn)) {
      return 'source_lfn must be in ' + ns.temp_user_area + name + '/ or ' + ns.temp_user_area +
        name + ".<hash>/ (the user's own temporary area" + (name.indexOf('.') === -1 ? ')' :
        '; a temporary area belongs to the part of its name before the first ".", so a user ' +
        'whose name holds a "." owns none)');
    }
    var groups = grantedGroups(roles);
    var destination = doc.destination_lfn, inGroup = false;
    for (i = 0; i < groups.length; i++) {
      if (startsWith(destination, ns.group_area + groups[i] + '/')) { inGroup = true; }
    }
    if (!startsWith(destination, ns.user_area + name + '/') && !inGroup) {
      var granted = groups.length ? 'or ' + ns.group_area + '<group>/ of ' + groups.join(', ') :
        '(a group area ' + ns.group_area + '<group>/ needs the role ' + ns.group_role + '<group>)';
      return 'destination_lfn must be in ' + ns.user_area + name + '/ ' + granted;
    }
    var info = doc.publish_info;
    var dataset = (info !== null && typeof info === 'object' && !Array.isArray(info)) ?
      info.dataset : undefined;
    if (typeof dataset === 'string') {
      var owner = datasetOwner(dataset);
      if (owner === null || (owner !== name && groups.indexOf(owner) === -1)) {
        return 'publish_info.dataset must be /<primary>/' + name + "-<processed>/USER (the user's " +
          'own datasets' + (name.indexOf('-') === -1 ? ')' : '; a dataset belongs to the part ' +
          'of its processed name before the first "-", so a user whose name holds a "-" owns none)');
      }
    }
    return null;
  }

  // A task belongs to the part of its name after the first ":" up to the next "_", as CRAB
  // names them (YYMMDD_HHMMSS:<user>_crab_<request>): a user records files in their own tasks.
  function taskOwner(task) {
    var colon = task.indexOf(':');
    var rest = colon >= 0 ? task.slice(colon + 1) : '';
    var cut = rest.indexOf('_');
    return cut > 0 ? rest.slice(0, cut) : null;
  }

  function taskRefusal(task, name) {
    if (taskOwner(task) === name) { return null; }
    return 'task must be <YYMMDD_HHMMSS>:' + name + '_<name>, as CRAB names them (a task ' +
      'belongs to the user named after its first ":" up to the next "_"' +
      (name.indexOf('_') === -1 ? ')' : ', so a user whose name holds a "_" owns none)');
  }

  // Priority orders a user's own files; a higher one than the owner's is an operator's.
  function priorityRefusal(doc) {
    if (!Object.prototype.hasOwnProperty.call(doc, 'priority') ||
        !(doc.priority > model.owner_max_priority)) { return null; }
    return 'priority must be <= ' + model.owner_max_priority + ': an owner may only lower ' +
      "their own files' priority (a higher one is an operator's)";
  }

  return {
    grantedGroups: grantedGroups,
    inTempArea: inTempArea,
    namespaceRefusal: namespaceRefusal,
    taskRefusal: taskRefusal,
    priorityRefusal: priorityRefusal
  };
};
