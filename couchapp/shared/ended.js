  // aso/model.py has_ended: the file's life is over as its owner sees it: never copied (failed,
  // killed: its temporary copy is discarded later), or copied with its temporary copy gone and
  // its publication over.
  function hasEnded(doc) {
    var FINAL = /* aso/model.py FINAL */ null;
    var NEVER_COPIED = /* aso/model.py NEVER_COPIED */ null;
    if (NEVER_COPIED.indexOf(doc.state) !== -1) { return true; }
    return FINAL.state.indexOf(doc.state) !== -1 && FINAL.cleanup.indexOf(doc.cleanup) !== -1 &&
      FINAL.publication.indexOf(doc.publication) !== -1;
  }
