// Loaded into pouchdb-server with `node --require` when ASO_STORE_CPU_PROFILE names a directory
// (aso/local/embedded.py, server_env): the embedded store's CPU profile, for the simulator's
// profile of where the store's time goes (sim/lifecycle.py, docs/performance.md). The first
// SIGUSR2 starts V8's sampling profiler, the next one stops it and writes the profile as
// <dir>/store-<pid>-<ms>.cpuprofile (Chrome DevTools' format). Nothing else changes.
'use strict';
const fs = require('fs');
const path = require('path');
const inspector = require('inspector');

const dir = process.env.ASO_STORE_CPU_PROFILE;
if (dir) {
  const session = new inspector.Session();
  session.connect();
  let running = false;
  process.on('SIGUSR2', () => {
    if (!running) {
      running = true;
      session.post('Profiler.enable', () =>
        session.post('Profiler.setSamplingInterval', {interval: 1000}, () =>
          session.post('Profiler.start')));
      return;
    }
    running = false;
    session.post('Profiler.stop', (err, result) => {
      if (err) {
        console.error('cpu profile: ' + err);
        return;
      }
      const file = path.join(dir, 'store-' + process.pid + '-' + Date.now() + '.cpuprofile');
      fs.writeFileSync(file, JSON.stringify(result.profile));
    });
  });
}
