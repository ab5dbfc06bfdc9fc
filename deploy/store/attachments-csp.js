// Loaded into pouchdb-server with `node --require` (aso/local/embedded.py, server_env):
// EMBEDDED_NO_ATTACHMENTS_CSP. CouchDB 3 sends a Content-Security-Policy with every attachment
// ([csp] attachments_header_value: ASO's policy, aso/provision/store_check.py ATTACHMENTS_CSP); pouchdb-server
// sends none. The monitoring pages are design-document attachments: with the same header on
// both stores, what they may run (no inline script, no eval, nothing from elsewhere) is the same,
// and a page that breaks the policy breaks on the embedded store too, not only in production.
'use strict';
const http = require('http');

const policy = process.env.ASO_ATTACHMENTS_CSP;
const writeHead = http.ServerResponse.prototype.writeHead;

http.ServerResponse.prototype.writeHead = function (...args) {
  // /db/_design/name/attachment: a design document's attachment (not _view, _show, ...).
  const parts = ((this.req && this.req.url) || '').split('?')[0].split('/');
  if (policy && parts.length > 4 && parts[2] === '_design' && parts[4] && !parts[4].startsWith('_')) {
    this.setHeader('Content-Security-Policy', policy);
  }
  return writeHead.apply(this, args);
};
