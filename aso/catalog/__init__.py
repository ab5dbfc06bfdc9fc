"""Catalogs that finished files are published to, behind one small interface
(aso.catalog.base): `embedded` (a catalog database in the document store, the default) and
`dbs` (DBS3 through its official client, production). `open_catalog(config)` picks one."""
