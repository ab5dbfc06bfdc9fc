function (doc) {
  // The blocks of a dataset, oldest first, with their counts.
  if (doc.type === 'block') {
    var size = 0;
    for (var i = 0; i < doc.files.length; i++) { size += doc.files[i].size; }
    emit([doc.dataset, doc.created, doc._id],
         {files: doc.files.length, size: size, origin_site: doc.origin_site, user: doc.user});
  }
}
