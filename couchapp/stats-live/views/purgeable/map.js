function (doc) {
  // Finished requests (nothing more will happen to them: model.is_final; a file never copied once
  // its temporary copy is gone) by last change: what the analytics agent may purge.
  var FINAL = /* aso/model.py FINAL */ null;
  var NEVER_COPIED = /* aso/model.py NEVER_COPIED */ null;
  if (doc.type !== /* aso/model.py REQUEST_TYPE */ null) { return; }
  if ((NEVER_COPIED.indexOf(doc.state) !== -1 && FINAL.cleanup.indexOf(doc.cleanup) !== -1) ||
      (FINAL.state.indexOf(doc.state) !== -1 && FINAL.cleanup.indexOf(doc.cleanup) !== -1 &&
       FINAL.publication.indexOf(doc.publication) !== -1)) {
    emit(doc.last_update, null);
  }
}
