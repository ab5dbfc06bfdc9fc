// Loaded into pouchdb-server with `node --require` (aso/local/embedded.py, server_env):
// EMBEDDED_VIEW_CONTEXT_PER_DOCUMENT. pouchdb-mapreduce runs a view's map function on each
// document by compiling the function's source with the document pasted into it and running
// that in a new V8 context (vm.runInNewContext): ~1.3 ms per document and view, three quarters
// of a view build's CPU (context creation, compilation, the garbage they leave), so a view was
// built at ~780 documents/s. Here each map or reduce function is compiled once per view
// update, in one sandbox context of its own; each call passes the arguments in as JSON text,
// parsed inside the sandbox, so the function sees objects of its own realm only, as before,
// and as CouchDB's query server does. What the function may call (emit, sum, log, isArray,
// toJSON), strict mode and the built-in reduce errors are pouchdb-mapreduce's own, unchanged.
//
// The hook replaces one line of pouchdb-mapreduce (pinned by deploy/store/package-lock.json)
// as node loads it; if that line is not there exactly once, the server refuses to start
// rather than run without the workaround unnoticed.
'use strict';
const Module = require('module');
const vm = require('vm');

const TARGET = /[\\/]pouchdb-mapreduce[\\/]lib[\\/]index\.js$/;
const MARKER = 'var evalFunction = evalFunc;';
const REPLACEMENT = 'var evalFunction = require(' + JSON.stringify(__filename) +
  ').compiledOnce(sum, createBuiltInErrorInVm, isBuiltInError, convertToTrueError);';

const compile = Module.prototype._compile;
Module.prototype._compile = function (content, filename) {
  if (TARGET.test(filename)) {
    if (content.split(MARKER).length !== 2) {
      throw new Error('view-functions.js: "' + MARKER + '" is not in ' + filename +
        ' exactly once (another pouchdb-mapreduce than deploy/store/package-lock.json pins?)');
    }
    content = content.replace(MARKER, REPLACEMENT);
  }
  return compile.call(this, content, filename);
};

function asJson(value) {
  return value === undefined ? undefined : JSON.stringify(value);
}

// pouchdb-mapreduce's evalFunction(func, emit) with its own helpers, compiled once.
exports.compiledOnce = function (sum, createBuiltInErrorInVm, isBuiltInError, convertToTrueError) {
  return function evalFunction(func, emit) {
    const source = '(function() {"use strict";' +
      'var createBuiltInError = ' + createBuiltInErrorInVm.toString() + ';' +
      'var sum = ' + sum.toString() + ';' +
      'var log = function () {};' +
      'var isArray = Array.isArray;' +
      'var toJSON = JSON.parse;' +
      'var __emitteds__ = [];' +
      'var emit = function (key, value) {__emitteds__.push([key, value]);};' +
      'var __fun__ = (' + func.replace(/;\s*$/, '') + ');' +
      'function __parse__(text) { return text === undefined ? undefined : JSON.parse(text); }' +
      'return function (a, b, c) {' +
      '  __emitteds__ = [];' +
      '  var __result__ = __fun__(__parse__(a), __parse__(b), __parse__(c));' +
      '  return {result: __result__, emitteds: __emitteds__};' +
      '};' +
      '})()';
    const call = new vm.Script(source).runInContext(vm.createContext(Object.create(null)));
    return function (arg1, arg2, arg3) {
      const output = call(asJson(arg1), asJson(arg2), asJson(arg3));
      if (emit) {
        output.emitteds.forEach(function (emitted) {
          emit(emitted[0], emitted[1]);
        });
      }
      if (isBuiltInError(output.result)) {
        output.result = convertToTrueError(output.result);
      }
      return output.result;
    };
  };
};
