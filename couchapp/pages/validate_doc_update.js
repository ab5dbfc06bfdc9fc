function (newDoc, oldDoc, userCtx) {
  // The pages database is public (the login page must load before anyone has logged in): it
  // holds only this design document, which `aso db init` writes with the store's admin account.
  // Everything else is refused, whoever asks.
  if ((userCtx.roles || []).indexOf('_admin') === -1) {
    throw({forbidden: 'the monitoring pages database is written by aso db init only'});
  }
}
