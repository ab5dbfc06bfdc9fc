// What makes a document a request of the schema: its type, size, fields, id and publication
// intent, judged as every store's JavaScript sees the values. validate_doc_update runs it on
// every write of a request, and ASO's Python runs the same file in QuickJS to judge an upload
// before it is sent (aso/provision/storejs.py): one source for the rule. ES5 only.
//
// module.exports(model, sha256): the checks over lib/model's tables and lib/sha256's hex,
// given by the caller (a module's own `require` is not the same on every store).
module.exports = function (model, sha256) {
  function refuse(rule, message) {
    throw({forbidden: '[' + rule + '] ' + message});
  }

  // Never obj.hasOwnProperty(k): a document may have a member of that name ({"hasOwnProperty":
  // 1} made the store answer 500).
  function has(obj, key) {
    return Object.prototype.hasOwnProperty.call(obj, key);
  }

  function typeOf(v) {
    if (v === null) { return 'null'; }
    if (Array.isArray(v)) { return 'array'; }  // COUCHDB_FOREIGN_ARRAYS: never instanceof
    if (typeof v === 'number') {
      if (!isFinite(v)) { return 'non-finite number'; }
      // Past 2^53 two JSON numbers read as one double: what is stored is not what was sent.
      if (Math.abs(v) > model.max_safe_integer) { return 'number beyond 2^53'; }
      return (v % 1 === 0) ? 'integer' : 'number';
    }
    return typeof v;  // string, boolean, object
  }

  function isType(v, t) {
    var actual = typeOf(v);
    return actual === t || (t === 'number' && actual === 'integer');
  }

  // A surrogate that is not half of a pair is no Unicode: CouchDB refuses such a body before
  // validation runs, the embedded store would keep it (COUCHDB_REFUSES_MALFORMED_FIRST).
  function loneSurrogate(text) {
    return /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?:^|[^\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(text);
  }

  function checkValue(path, v, spec) {
    var types = Array.isArray(spec.type) ? spec.type : [spec.type];
    var kind = null;
    for (var i = 0; i < types.length; i++) {
      if (isType(v, types[i])) { kind = types[i]; break; }
    }
    if (kind === null) {
      refuse('schema', path + ' must be ' + types.join(' or ') + ', not ' + typeOf(v));
    }
    if (spec['enum'] && spec['enum'].indexOf(v) === -1) {
      refuse('schema', path + ' must be one of ' + spec['enum'].join(', ') + ', not ' + JSON.stringify(v));
    }
    if (kind === 'string') {
      if (loneSurrogate(v)) { refuse('schema', path + ' is not valid Unicode (a lone surrogate)'); }
      var max = spec.max || model.max_string;
      if (v.length > max) { refuse('schema', path + ' is longer than ' + max + ' characters'); }
      if (spec.min_length && v.length < spec.min_length) { refuse('schema', path + ' must not be empty'); }
      if (spec.pattern && !(new RegExp(spec.pattern)).test(v)) {
        refuse('schema', path + ' ' + JSON.stringify(v) + ' does not match ' + spec.pattern);
      }
    } else if (kind === 'integer' || kind === 'number') {
      if (spec.min !== undefined && v < spec.min) { refuse('schema', path + ' must be >= ' + spec.min); }
      if (spec.max_value !== undefined && v > spec.max_value) { refuse('schema', path + ' must be <= ' + spec.max_value); }
    } else if (kind === 'array') {
      var maxItems = spec.max_items || 1000;
      if (v.length > maxItems) { refuse('schema', path + ' has more than ' + maxItems + ' items'); }
      for (var j = 0; j < v.length; j++) { checkValue(path + '[' + j + ']', v[j], spec.items); }
    } else if (kind === 'object') {
      // Bounded as a whole (publish_info: what becomes a catalog block's file entry).
      if (spec.max_chars && JSON.stringify(v).length > spec.max_chars) {
        refuse('schema', path + ' is larger than ' + spec.max_chars + ' characters as JSON');
      }
      checkObject(path, v, spec);
    }
  }

  function checkObject(path, obj, spec) {
    var key;
    if (spec.values) {
      var n = 0;
      for (key in obj) { if (has(obj, key)) { n++; } }
      // Counted before the values are checked: a hostile object is not walked.
      if (n > (spec.max_keys || 1000)) { refuse('schema', path + ' has more than ' + (spec.max_keys || 1000) + ' keys'); }
      for (key in obj) {
        if (!has(obj, key)) { continue; }
        // Copying such an object makes it the copy's prototype: the member would be lost.
        if (key === '__proto__') { refuse('schema', path + ' has a member named __proto__, which stores lose'); }
        if (loneSurrogate(key)) { refuse('schema', path + ' has a member name that is not valid Unicode'); }
        checkValue(path + '.' + key, obj[key], spec.values);
      }
      return;
    }
    var required = spec.required || [];
    for (var i = 0; i < required.length; i++) {
      if (!has(obj, required[i])) { refuse('schema', path + '.' + required[i] + ' is required'); }
    }
    var fields = spec.fields || {};
    for (key in obj) {
      if (!has(obj, key)) { continue; }
      // The store's own members; any other "_" member (_attachments) is no field of a request.
      if (path === 'doc' && model.store_members.indexOf(key) !== -1) { continue; }
      if (!has(fields, key)) { refuse('schema', path + '.' + key + ' is not a field of the schema'); }
      checkValue(path + '.' + key, obj[key], fields[key]);
    }
  }

  // What a document's size is measured on: its own fields, not the store's "_" members (which
  // differ between stores), as aso/model.py doc_chars measures it for the front end.
  function ownFields(doc) {
    var out = {};
    for (var key in doc) {
      if (has(doc, key) && key.charAt(0) !== '_') { out[key] = doc[key]; }
    }
    return out;
  }

  // A request's document, to be created (`creation`) or updated.
  function checkRequest(doc, creation) {
    if (doc.type !== model.request_type) {
      refuse('type', 'unknown document type ' + JSON.stringify(doc.type) + '; expected ' + model.request_type);
    }
    if (JSON.stringify(ownFields(doc)).length > model.max_doc_chars) {
      refuse('schema', 'the document is larger than ' + model.max_doc_chars + ' characters');
    }
    checkObject('doc', doc, model.schema);
    // After the schema: source_lfn is a string of valid Unicode (a lone surrogate has no UTF-8).
    // A creation's id is its source's hash, so nobody takes the id of another's next upload; an
    // update keeps the id it was created with.
    var idRule = 'doc._id must be the request id: sha256 of source_lfn';
    if (creation) {
      var expected = sha256(doc.source_lfn);
      if (doc._id !== expected) { refuse('schema', idRule + ' (' + expected + ')'); }
    } else if (!(new RegExp(model.doc_id_pattern)).test(doc._id)) {
      refuse('schema', idRule + ' (64 lower-case hex digits)');
    }
    if (doc.publish && doc.file_type === 'output' && !doc.publish_info) {
      refuse('schema', 'doc.publish_info is required when publish is true');
    }
  }

  return {refuse: refuse, has: has, typeOf: typeOf, checkObject: checkObject,
          checkRequest: checkRequest};
};
