function (doc) {
  // Publication block by block, for the publication page (read by key range, never whole):
  // [publication state, dataset, block, user] for files waiting for a block (pending: no block
  // yet), or whose block failed (the catalog's reason);
  // ['published', when] for published files, read newest first with a limit.
  if (doc.type !== 'transfer_request' || !doc.publish || doc.state !== 'done') { return; }
  var dataset = (doc.publish_info || {}).dataset || '';
  var done = doc.last_update, published = doc.last_update;
  for (var i = 0; i < (doc.history || []).length; i++) {
    var h = doc.history[i];
    if (h.axis === 'state' && h.to === 'done') { done = h.at; }
    if (h.axis === 'publication' && h.to === 'published') { published = h.at; }
  }
  var value = {dataset: dataset, block: doc.publication_block || null, user: doc.user,
    task: doc.task, job_id: doc.job_id, size: doc.size, done: done};
  if (doc.publication === 'published') {
    emit(['published', published], value);
  } else if (doc.publication !== 'not_required') {
    value.error = doc.publication_error || null;
    value.attempts = doc.publication_attempts || 0;
    value.since = doc.last_update;
    emit([doc.publication, dataset, doc.publication_block || null, doc.user], value);
  }
}
