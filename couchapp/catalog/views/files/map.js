function (doc) {
  // Which block holds an LFN (at most one, enforced by publish_block).
  if (doc.type === 'block') {
    for (var i = 0; i < doc.files.length; i++) {
      emit(doc.files[i].lfn, {block: doc._id, dataset: doc.dataset, created: doc.created});
    }
  }
}
