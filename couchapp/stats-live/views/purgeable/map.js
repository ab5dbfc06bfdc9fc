function (doc) {
  // Finished requests (nothing more will happen to them: model.is_final) by last change: what the
  // analytics agent may purge.
  var FINAL = /* aso/model.py FINAL */ null;
  if (doc.type !== /* aso/model.py REQUEST_TYPE */ null) { return; }
  if (doc.state === 'failed' || doc.state === 'killed' ||
      (FINAL.state.indexOf(doc.state) !== -1 && FINAL.cleanup.indexOf(doc.cleanup) !== -1 &&
       FINAL.publication.indexOf(doc.publication) !== -1)) {
    emit(doc.last_update, null);
  }
}
